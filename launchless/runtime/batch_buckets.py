"""The runtime's batch buckets for one wrapped model: which bucket a call goes to, the proof that padding is safe
for this model, and how traffic fits the buckets.

``wrap(model, batch_buckets=[1, 2, 4, 8, 16, 32])``: a call of 5 rows is padded to 8, replays the graph of the
8-row signature, and gets its 5 rows back. ``batch_buckets="auto"`` chooses them from the sizes seen: the power of
two that holds each batch (a batch of 5 opens the bucket of 8, and 6 and 7 go there too) -- at most one graph per
doubling of the batch, none for sizes never seen. Before the first call that is padded to a bucket, the model is proven
to keep rows apart (``core.buckets.prove_rows_independent``: two different paddings, bit for bit; and the rows
against the unpadded call). A model whose rows interact -- or whose outputs are not per row -- is refused buckets
with one WARNING naming why, and every batch size gets its own signature, as without buckets. A batch larger than
the largest bucket runs with its own signature too, with one WARNING per model. Traffic that misses the buckets the
other way -- sizes far below the bucket they go to, so that at least half of the rows the bucket graphs compute are
padding -- gets one WARNING per model too, naming the sizes padded most.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..core.buckets import (
    RowsVerdict,
    batch_rows,
    bucket_for,
    check_buckets,
    pad_rows,
    prove_rows_independent,
    slice_rows,
)
from ..core.signature import FlatInputs, Signature, signature_of

log = logging.getLogger("launchless")
AUTO = "auto"  # buckets chosen from the sizes seen: the powers of two that hold them
PLANS_KEPT = 1024  # call signatures whose bucket is remembered
PADDING_LOOK_EVERY = 256  # padded calls between looks at how much of the bucket graphs' work was padding
PADDING_WARN_SHARE = 0.5  # one WARNING once at least this share of the rows computed were padding


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """One call's way through a bucket: its rows, the bucket, the call's own inputs and the bucket's signature."""

    rows: int
    bucket: int
    flat: FlatInputs  # the call as given
    signature: Signature  # the call's inputs padded to the bucket

    @property
    def padded(self) -> bool:
        return self.rows < self.bucket

    def padded_flat(self) -> FlatInputs:
        """The call's inputs padded to the bucket (new tensors: for a capture or a proof; a replay writes the rows
        straight into the graph's own input buffers instead)."""
        return self.flat._replace(leaves=pad_rows(self.flat.leaves, self.bucket)) if self.padded else self.flat

    def take_rows(self, outputs: Any) -> Any:
        """The call's own rows of the bucket's outputs."""
        return slice_rows(outputs, self.rows, self.bucket) if self.padded else outputs


class BatchBucketing:
    """Batch buckets of one wrapped model (see the module docstring)."""

    def __init__(self, sizes: Any, *, name: str, tolerance_ulps: float) -> None:
        self.automatic = isinstance(sizes, str) and sizes == AUTO
        self.sizes: tuple[int, ...] = () if self.automatic else check_buckets(sizes)
        self.name, self.tolerance_ulps = name, tolerance_ulps
        self.verdicts: dict[int, RowsVerdict] = {}  # bucket -> the proof for this model
        self.refused: RowsVerdict | None = None  # the rows interact: no call is padded any more
        self.padded_calls = self.padded_rows = self.exact_calls = self.calls_over = 0
        self.rows_computed = 0  # the bucket graphs' rows, padding included
        self._padded_sizes: Counter[int] = Counter()  # rows of the padded calls, for the padding WARNING
        self._warned_over = self._warned_padding = False
        self._plans: dict[Signature, tuple[int | None, int | None, Signature | None]] = {}  # per call signature

    def plan(self, flat: FlatInputs, signature: Signature) -> BucketPlan | None:
        """The bucket this call goes to; None where the call keeps its own signature (no batch dimension shared by
        the inputs, larger than every bucket, or buckets refused for this model). ``signature`` is the call's own:
        the bucket and its signature are worked out once per signature, not per call."""
        if self.refused is not None:
            return None
        known = self._plans.get(signature)
        if known is None:
            known = self._plans[signature] = self._new_plan(flat)
            if len(self._plans) > PLANS_KEPT:  # signatures that vary in more than the batch: the oldest go
                del self._plans[next(iter(self._plans))]
        rows, bucket, padded_signature = known
        if rows is None:
            return None
        if bucket is None:
            self.calls_over += 1
            if not self._warned_over:
                self._warned_over = True
                log.warning(
                    "launchless: %s got a batch of %d rows, larger than its largest bucket (%d); such batches run "
                    "with their own graph signature. Add a larger bucket to batch_buckets to pad them. Shown once.",
                    self.name,
                    rows,
                    self.sizes[-1],
                )
            return None
        return BucketPlan(rows, bucket, flat, padded_signature or signature)

    def _new_plan(self, flat: FlatInputs) -> tuple[int | None, int | None, Signature | None]:
        """(rows, bucket, the padded inputs' signature) of a call signature seen for the first time."""
        rows = batch_rows(flat.leaves)
        if rows is None:
            return None, None, None
        if self.automatic:  # the power of two that holds it (a bucket from now on)
            bucket: int | None = 1 << (rows - 1).bit_length()
            if bucket not in self.sizes:
                self.sizes = tuple(sorted((*self.sizes, bucket)))
        else:
            bucket = bucket_for(rows, self.sizes)
        if bucket is None or bucket == rows:
            return rows, bucket, None
        return rows, bucket, signature_of(flat._replace(leaves=pad_rows(flat.leaves, bucket)))

    def proven(self, plan: BucketPlan, fn: Callable[..., Any]) -> bool:
        """Whether padding to ``plan.bucket`` is proven safe for this model (proven now, at the first padded call of
        that bucket, on this call's own inputs). A refusal stops all padding, with one WARNING."""
        if not plan.padded:
            return True
        verdict = self.verdicts.get(plan.bucket)
        if verdict is None:
            verdict = self.verdicts[plan.bucket] = prove_rows_independent(
                fn, plan.flat, plan.bucket, tolerance_ulps=self.tolerance_ulps
            )
        if not verdict.independent:
            self.refused = verdict
            log.warning(
                "launchless: %s cannot pad batches to buckets: %s (%s). Every batch size gets its own graph "
                "signature; pass batches of the bucket sizes yourself, or leave batch_buckets out.",
                self.name,
                verdict.status,
                verdict.detail,
            )
            return False
        return True

    def count(self, plan: BucketPlan) -> None:
        """One call through its bucket, counted; every ``PADDING_LOOK_EVERY`` padded calls, whether padding has
        become most of the work (one WARNING per model)."""
        self.rows_computed += plan.bucket
        if not plan.padded:
            self.exact_calls += 1
            return
        self.padded_calls += 1
        self.padded_rows += plan.bucket - plan.rows
        self._padded_sizes[plan.rows] += 1
        if self.padded_calls % PADDING_LOOK_EVERY == 0 and not self._warned_padding:
            self._warn_if_mostly_padding()

    def padding_share(self) -> float:
        """The share of the rows the bucket graphs computed that were padding."""
        return self.padded_rows / self.rows_computed if self.rows_computed else 0.0

    def _warn_if_mostly_padding(self) -> None:
        share = self.padding_share()
        if share < PADDING_WARN_SHARE:
            return
        self._warned_padding = True
        most = ", ".join(f"{rows} rows ({calls} calls)" for rows, calls in self._padded_sizes.most_common(3))
        log.warning(
            "launchless: %s: %.0f%% of the rows its bucket graphs computed were padding (buckets %s; the batch sizes "
            "padded most: %s). Add buckets at or just above those sizes, or pass batch_buckets='auto'. Shown once.",
            self.name,
            100 * share,
            list(self.sizes),
            most,
        )

    def info(self) -> dict[str, Any]:
        """For ``graph_info()["batch_buckets"]``: the sizes, how calls fitted them, the proof per bucket."""
        return {
            "sizes": list(self.sizes),
            "automatic": self.automatic,
            "exact_calls": self.exact_calls,
            "padded_calls": self.padded_calls,
            "padding_rows": self.padded_rows,
            "padding_share": self.padding_share(),  # of the rows the bucket graphs computed
            "calls_over_largest": self.calls_over,
            "proofs": {
                bucket: {"status": str(v.status), "max_abs_diff": v.max_abs, "bound": v.bound, "detail": v.detail}
                for bucket, v in sorted(self.verdicts.items())
            },
            "refused": None if self.refused is None else f"{self.refused.status}: {self.refused.detail}",
        }
