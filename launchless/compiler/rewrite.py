"""GraCE's CGCT as FX passes: host-side constants rebuilt on the device, so a blocked graph is captured whole.

One CPU tensor copied to the GPU on every call stops capture of its whole graph (GraCE §2.3.1, §4.1). When the
host side is built from constructors and constants only, that copy need not run at replay time:
- constructors (arange, full, zeros, torch.tensor, ...) feeding a host->device copy, possibly through pure CPU
  ops, are built on the device instead, and the copy is dropped;
- a graph constant or module attribute (``get_attr``) copied to the device is copied once, now, registered on the
  GraphModule as ``_launchless_const_N`` and guarded by its source's ``_version`` and ``data_ptr``
  (:func:`constants_still_valid`);
- so is a CPU tensor that reaches the graph as a static input (``static_inputs``: how Dynamo passes a plain
  tensor attribute of a module, e.g. an anchor table); the input stays in the signature, unread.
- with ``fold=True`` (tried when building on the device does not give eager's bits: a CUDA division by a host
  scalar is a multiplication by its reciprocal) the host computation runs once, now, with the very host ops eager
  runs, and its result is copied to the device as a constant, guarded by its sources.
Anything not provably safe -- a value that depends on a graph input or a host sync, one also used on the host,
random or in-place ops, data-dependent shapes -- is left alone and reported with the reason. A rewrite is still
only trusted after ``differential.differential_check`` finds the rewritten graph bit-identical on random inputs.

On an aten graph traced with real CPU tensors, ``target_device="cpu"`` treats ``.to(device, copy=True)``-style
copies as the transfers, so the passes and the check can be exercised without a GPU.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..diagnose.blockers import DATA_DEPENDENT_OPS, HOST_SYNC_OPS, syncs_with_the_host
from .diagnose import _COPIES, _name, source_line

CONSTRUCT = "built on the device"
CONSTANT = "constant moved to the device at compile time"
ATTRIBUTE = "module attribute moved to the device at compile time"
FOLDED = "host computation folded into a device constant at compile time"
_PREFIX = "_launchless_const_"
_GUARDS = "launchless_constant_guards"  # in gm.meta, which deep copies keep
_FROZEN = "_frozen_param"
_LIFTS = {"lift_fresh_copy", "lift_fresh"}
_SHAPE_OPS = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}
_MAY_ALIAS = {"to", "contiguous", "reshape", "view_as", "flatten", "lift_fresh", "alias"}
_SOURCE_ARG = {"copy_": 1, "copy": 1}  # copy_(dst, src); _to_copy/to(src, ...)


@dataclass(frozen=True)
class AppliedRewrite:
    """A host->device copy that no longer runs at replay time, and the host nodes now on the device."""

    kind: str
    node: str
    device: str
    source: str | None = None
    moved: tuple[str, ...] = ()

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"{self.kind}: {self.node} -> {self.device} (moved {', '.join(self.moved)}){where}"


@dataclass(frozen=True)
class SkippedRewrite:
    """A blocker CGCT left alone, and why it is not provably safe to rewrite."""

    node: str
    target: str
    reason: str
    source: str | None = None

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"{self.target} ({self.node}): {self.reason}{where}"


@dataclass
class RewriteReport:
    """What :func:`rewrite` changed and what it refused to change."""

    applied: list[AppliedRewrite] = field(default_factory=list)
    skipped: list[SkippedRewrite] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"CGCT: {len(self.applied)} host->device copies rewritten, {len(self.skipped)} blockers left alone"]
        lines += [f"  rewritten  {a.describe()}" for a in self.applied]
        lines += [f"  left alone {s.describe()}" for s in self.skipped]
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class ConstantGuard:
    """The CPU source of a constant copied at compile time: an in-place change to it makes the copy stale."""

    name: str
    source_attr: str
    source: torch.Tensor = field(repr=False)
    version: int
    data_ptr: int | None
    input_name: str | None = None  # the graph input it came from, when it was a static input
    folded: torch.Tensor | None = field(default=None, repr=False)  # for a folded source: its values when folded

    def valid(self) -> bool:
        return self.source._version == self.version and _data_ptr(self.source) == self.data_ptr

    def __deepcopy__(self, memo: dict) -> ConstantGuard:
        return self  # a deep copy of the module still reads a copy of the same source: keep watching the original


@dataclass(frozen=True)
class _Transfer:
    node: fx.Node
    src: fx.Node
    device: torch.device


_Plan = dict[_Transfer, "set[fx.Node] | str"]


def constant_guards(gm: fx.GraphModule) -> list[ConstantGuard]:
    """The guards of the constants :func:`rewrite` moved to the device in ``gm``."""
    return list(getattr(gm, "meta", {}).get(_GUARDS, ()))


def constants_still_valid(gm: fx.GraphModule) -> bool:
    """False once the CPU source of any constant moved by :func:`rewrite` was changed in place (re-run it)."""
    return all(guard.valid() for guard in constant_guards(gm))


def rewrite(
    gm: fx.GraphModule,
    target_device: str | torch.device | None = None,
    static_inputs: Mapping[str, torch.Tensor] | None = None,
    fold: bool = False,
) -> RewriteReport:
    """Apply CGCT to ``gm`` in place; ``target_device`` None means every host->non-CPU copy's own destination.

    ``static_inputs`` (placeholder name -> the tensor it always receives) may be moved like module attributes.
    ``fold``: run each host computation now, on the host, instead of moving it to the device (needs real tensors)."""
    target = torch.device(target_device) if target_device is not None else None
    statics = dict(static_inputs or {})
    transfers = [t for n in gm.graph.nodes if (t := _transfer(n, target)) is not None]
    plans, devices = _plan(gm, transfers, statics)
    if fold:
        values = _fold_values(gm, plans, statics)
        report = _report(gm, plans, FOLDED)
        _fold(gm, plans, values, statics)
    else:
        report = _report(gm, plans)
        _apply(gm, plans, devices, statics)
    gm.graph.lint()
    gm.recompile()
    return report


# --- finding the transfers and what they copy -------------------------------------------------------------------


def _val(node: object) -> object:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors of a node value (a tensor, or a list/tuple of them); [] when it holds anything else."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return list(values) if values and all(isinstance(v, torch.Tensor) for v in values) else []


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _explicit_device(node: fx.Node) -> bool:
    return node.kwargs.get("device") is not None or any(isinstance(a, torch.device) for a in node.args)


def _transfer(node: fx.Node, target: torch.device | None) -> _Transfer | None:
    """``node`` as a copy from the host to ``target`` (any non-CPU device when None), or None."""
    if node.op != "call_function" or _name(node) not in _COPIES:
        return None
    index = _SOURCE_ARG.get(_name(node), 0)
    src = node.args[index] if len(node.args) > index else None
    src_val, out = _val(src), _val(node)
    if not isinstance(src_val, torch.Tensor) or not isinstance(out, torch.Tensor) or src_val.device.type != "cpu":
        return None
    if target is None:
        wanted = out.device.type != "cpu"
    else:  # a CPU "transfer" must ask for the device explicitly: `.to(x.device, copy=True)`
        wanted = _same_device(out.device, target) and (target.type != "cpu" or _explicit_device(node))
    return _Transfer(node, src, out.device) if wanted else None


def _fetch(gm: fx.GraphModule, target: str) -> object:
    try:
        return functools.reduce(getattr, target.split("."), gm)
    except AttributeError:
        return None


def _available(device: torch.device) -> bool:
    module = getattr(torch, device.type, None)
    return device.type == "cpu" or bool(getattr(module, "is_available", lambda: False)())


def _impurity(node: fx.Node) -> str | None:
    """Why ``node`` may not give the same values wherever and whenever it runs, or None when it does."""
    target = node.target
    if node.op == "call_function" and target is operator.getitem:
        return None
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return "is not an aten op"
    if target._schema.is_mutable:
        return "writes in place"
    if torch.Tag.nondeterministic_seeded in target.tags:
        return "draws random numbers"
    return "has a data-dependent output shape" if torch.Tag.dynamic_output_shape in target.tags else None


def _pure(node: fx.Node) -> bool:
    return _impurity(node) is None


def _is_scalar_arith(node: fx.Node) -> bool:
    module = getattr(node.target, "__module__", None) or ""
    return module in ("_operator", "operator", "math") or _name(node).startswith("sym_")


def _written_in_graph(gm: fx.GraphModule, target: str) -> str | None:
    """The node that writes in place into attribute ``target``, if any does."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target == target:
            writer = next((u for u in node.users if u.op == "call_function" and not _pure(u)), None)
            if writer is not None:
                return writer.name
    return None


def _attr_problem(gm: fx.GraphModule, node: fx.Node, device: torch.device, src: object = None) -> str | None:
    """Why the constant ``node`` reads (``src`` for a static input) cannot be copied once and guarded, or None."""
    name = str(node.target)
    if node.op == "get_attr":
        src = _fetch(gm, name)
    if not isinstance(src, torch.Tensor):
        return f"{name} is not a tensor"
    if src.requires_grad:
        return f"{name} needs gradients: a device copy would cut autograd off from it"
    if src.is_inference():
        return f"{name} is an inference tensor: in-place changes to it could not be detected"
    if not _available(device) and not isinstance(_val(node), FakeTensor):
        return f"{device} is not available here to hold a copy of {name}"
    if node.op == "placeholder":
        writer = next((u.name for u in node.users if u.op == "call_function" and not _pure(u)), None)
    else:
        writer = _written_in_graph(gm, name)
    return f"{name} is written in place by {writer}" if writer else None


def _problem(
    gm: fx.GraphModule, node: fx.Node, device: torch.device, statics: Mapping[str, torch.Tensor]
) -> str | None:
    """Why ``node`` cannot be computed once on ``device`` from constants, or None when it can."""
    if node.op == "placeholder":
        if node.name in statics:
            return _attr_problem(gm, node, device, statics[node.name])
        return f"depends on graph input {node.name}"
    if node.op == "get_attr":
        return _attr_problem(gm, node, device)
    if node.op != "call_function":
        return f"depends on {node.op} {node.name}"
    name, val = _name(node), _val(node)
    if name in HOST_SYNC_OPS:
        return f"depends on a host sync ({node.name}: .item(), float(t))"
    if name in DATA_DEPENDENT_OPS or free_unbacked_symbols(val):
        return f"depends on a data-dependent value ({name} in {node.name})"
    if not _tensors(val):
        return (
            None if name in _SHAPE_OPS or _is_scalar_arith(node) else f"{name} in {node.name} is not shape arithmetic"
        )
    if any(t.device.type != "cpu" for t in _tensors(val)):
        return f"reads device tensor {node.name} on the host"
    impurity = _impurity(node)
    return f"{name} in {node.name} {impurity}" if impurity else None


def _closure(gm: fx.GraphModule, t: _Transfer, statics: Mapping[str, torch.Tensor]) -> set[fx.Node] | str:
    """The host tensor nodes ``t`` copies from, when all come from constants; else why not."""
    seen: set[fx.Node] = set()
    stack = [t.src]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        problem = _problem(gm, node, t.device, statics)
        if problem:
            return problem
        seen.add(node)
        if _name(node) not in _SHAPE_OPS:  # a size is not data: its tensor may be an input
            stack.extend(node.all_input_nodes)
    return {n for n in seen if _tensors(_val(n))}


def _host_use(node: fx.Node, owners: dict[fx.Node, set[torch.device]], sources: dict[fx.Node, fx.Node]) -> str | None:
    """Why ``node`` must stay on the host: another device wants it too, or a host op or the caller reads it."""
    if len(owners[node]) > 1:
        return f"{node.name} is copied to several devices"
    for user in node.users:
        if user in owners or sources.get(user) is node:
            continue
        return (
            f"{node.name} is returned on the host"
            if user.op == "output"
            else f"{node.name} is also used on the host by {user.name}"
        )
    return None


def _owners(plans: _Plan) -> dict[fx.Node, set[torch.device]]:
    owners: dict[fx.Node, set[torch.device]] = {}
    for t, plan in plans.items():
        for node in plan if isinstance(plan, set) else ():
            owners.setdefault(node, set()).add(t.device)
    return owners


def _plan(
    gm: fx.GraphModule, transfers: list[_Transfer], statics: Mapping[str, torch.Tensor]
) -> tuple[_Plan, dict[fx.Node, torch.device]]:
    """Each transfer's host nodes (or why not), shrunk until no moved node is still needed on the host."""
    plans: _Plan = {t: _closure(gm, t, statics) for t in transfers}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    while True:
        owners = _owners(plans)
        sources = {t.node: t.src for t, plan in plans.items() if isinstance(plan, set)}
        bad = {n: r for n in owners if (r := _host_use(n, owners, sources))}
        if not bad:
            return plans, {n: next(iter(devices)) for n, devices in owners.items()}
        for t, plan in plans.items():
            if isinstance(plan, set) and plan & bad.keys():
                plans[t] = bad[min(plan & bad.keys(), key=order.__getitem__)]


def _kind(plan: set[fx.Node]) -> str:
    """A literal (``torch.tensor([...])`` lifts a fresh copy; frozen params) or a module attribute read as is."""
    if any(n.op == "placeholder" for n in plan):
        return ATTRIBUTE  # a module attribute Dynamo passes in as a static input
    attrs = [n for n in plan if n.op == "get_attr"]
    if not attrs:
        return CONSTRUCT
    literal = [str(a.target).startswith(_FROZEN) or any(_name(u) in _LIFTS for u in a.users) for a in attrs]
    return CONSTANT if all(literal) else ATTRIBUTE


def _report(gm: fx.GraphModule, plans: _Plan, kind: str | None = None) -> RewriteReport:
    """Built before the graph changes, while every node still has its original name and trace."""
    report = RewriteReport()
    for t, plan in plans.items():
        if isinstance(plan, set):
            moved = [n for n in gm.graph.nodes if n in plan]
            source = source_line(t.node) or next((s for n in moved if (s := source_line(n))), None)
            names = tuple(n.name for n in moved)
            report.applied.append(AppliedRewrite(kind or _kind(plan), t.node.name, str(t.device), source, names))
        else:
            report.skipped.append(SkippedRewrite(t.node.name, str(t.node.target), plan, source_line(t.node)))
    for node in gm.graph.nodes:
        reason = _unrewritable(node)
        if reason:
            report.skipped.append(SkippedRewrite(node.name, str(node.target), reason, source_line(node)))
    return report


def _unrewritable(node: fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    if syncs_with_the_host(_name(node), node.args, node.kwargs):
        return "host sync: the host reads a tensor's value (.item(), float(t)); no device-side form keeps its meaning"
    if _name(node) in DATA_DEPENDENT_OPS:
        return "data-dependent shape: the output size is known only after the kernel has run"
    return None


# --- changing the graph -----------------------------------------------------------------------------------------


def _apply(
    gm: fx.GraphModule, plans: _Plan, devices: dict[fx.Node, torch.device], statics: Mapping[str, torch.Tensor]
) -> None:
    """Move every planned host node to its device, then drop the copies that became no-ops."""
    moved: dict[tuple[str, torch.device], str] = {}
    for node in [n for n in gm.graph.nodes if n in devices]:
        if node.op in ("get_attr", "placeholder"):
            _move_constant(gm, node, devices[node], moved, statics.get(node.name))
        else:
            _retarget(node, devices[node])
    applied = {t.node for t, plan in plans.items() if isinstance(plan, set)}
    for node in [n for n in gm.graph.nodes if n in applied]:
        _drop_copy(gm, node)


def _fold_values(gm: fx.GraphModule, plans: _Plan, statics: Mapping[str, torch.Tensor]) -> dict[_Transfer, object]:
    """Each planned transfer's result, computed now; a transfer that cannot be gets its reason as its plan."""
    values = {}
    for t, plan in plans.items():
        if not isinstance(plan, set):
            continue
        if _name(t.node) in _SOURCE_ARG:
            plans[t] = "a copy into an existing device tensor is not folded"
            continue
        try:
            values[t] = _host_value(gm, t, plan, statics)
        except Exception as exc:
            plans[t] = f"its host computation could not run at compile time ({type(exc).__name__}: {exc})"
    return values


def _host_value(gm: fx.GraphModule, t: _Transfer, plan: set[fx.Node], statics: Mapping[str, torch.Tensor]) -> object:
    """What the transfer hands the device, computed by the same host ops eager runs: bit for bit eager's copy."""
    env: dict[fx.Node, object] = {}

    def value(node: fx.Node) -> object:
        if node not in env:
            raise ValueError(f"{node.name} is not computed from constants alone")
        return env[node]

    def call(node: fx.Node) -> object:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
        return node.target(*args, **kwargs)

    with torch.no_grad():
        for node in gm.graph.nodes:
            if node in plan:
                if node.op == "get_attr":
                    env[node] = _fetch(gm, str(node.target))
                elif node.op == "placeholder":
                    env[node] = statics[node.name]
                else:
                    env[node] = call(node)
        result = call(t.node)
    if not isinstance(result, torch.Tensor) or isinstance(result, FakeTensor):
        raise ValueError(f"{t.node.name} gives no real tensor here")
    return result


def _fold(
    gm: fx.GraphModule, plans: _Plan, values: dict[_Transfer, object], statics: Mapping[str, torch.Tensor]
) -> None:
    """Replace each folded transfer by a device constant guarded by its host sources; drop the host ops."""
    folded: set[fx.Node] = set()
    for t, plan in plans.items():
        if not isinstance(plan, set):
            continue
        name = _free_name(gm)
        gm.register_buffer(name, values[t], persistent=False)
        guards = []
        for node in (n for n in gm.graph.nodes if n in plan and n.op in ("get_attr", "placeholder")):
            is_input = node.op == "placeholder"
            src = statics[node.name] if is_input else _fetch(gm, str(node.target))
            label = f"input {node.name}" if is_input else str(node.target)
            input_name = node.name if is_input else None
            guards.append(ConstantGuard(name, label, src, src._version, _data_ptr(src), input_name, src.clone()))
        gm.meta[_GUARDS] = [*constant_guards(gm), *guards]
        with gm.graph.inserting_before(t.node):
            constant = gm.graph.get_attr(name)
        constant.meta = dict(t.node.meta)
        t.node.replace_all_uses_with(constant)
        gm.graph.erase_node(t.node)
        folded |= plan
    for node in reversed(list(gm.graph.nodes)):  # host ops nobody reads now; placeholders stay (the signature)
        if node in folded and node.op != "placeholder" and not node.users:
            gm.graph.erase_node(node)


def _on(value: object, device: torch.device) -> object:
    """``value`` (a node's meta "val") as it is when computed on ``device``."""
    if isinstance(value, (list, tuple)):
        return type(value)(_on(v, device) for v in value)
    if isinstance(value, FakeTensor):
        with value.fake_mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
    if isinstance(value, torch.Tensor) and _available(device):
        return value.to(device)
    return value


def _retarget(node: fx.Node, device: torch.device) -> None:
    """Point an explicit ``device`` argument (or a factory's default) at ``device``; dtype and layout stay."""
    _set_device_arg(node, device)
    node.meta["val"] = _on(_val(node), device)


def _set_device_arg(node: fx.Node, device: torch.device) -> None:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return
    names = [a.name for a in target._schema.arguments]
    if "device" not in names:
        return
    factory = not any(_tensors(_val(a)) for a in node.all_input_nodes)
    index = names.index("device")
    if index < len(node.args):
        if node.args[index] is not None or factory:
            node.args = (*node.args[:index], device, *node.args[index + 1 :])
    elif node.kwargs.get("device") is not None or factory:
        node.kwargs = {**node.kwargs, "device": device}


def _data_ptr(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.data_ptr()
    except RuntimeError:  # fake and meta tensors have no storage
        return None


def _device_copy(src: torch.Tensor, device: torch.device, val: object) -> torch.Tensor:
    """A copy of ``src`` on ``device``; a fake one when the device is missing here (a graph traced with fakes)."""
    with torch.no_grad():
        if _available(device):
            return src.detach().to(device, copy=True)
        mode = val.fake_mode  # _attr_problem made sure the node's value is fake
        fake = src if isinstance(src, FakeTensor) else mode.from_tensor(src)
        with mode:
            return fake.to(device, copy=True)


def _move_constant(
    gm: fx.GraphModule,
    node: fx.Node,
    device: torch.device,
    moved: dict[tuple[str, torch.device], str],
    static_input: torch.Tensor | None = None,
) -> None:
    """Copy the constant ``node`` reads (a static input's tensor) to ``device`` once, guard its source, and read
    the copy instead. A static input's placeholder stays, unread, so that the graph's signature does not change."""
    is_input = node.op == "placeholder"
    key = (node.name if is_input else str(node.target), device)
    if key not in moved:
        src = static_input if is_input else _fetch(gm, key[0])
        moved[key] = name = _free_name(gm)
        gm.register_buffer(name, _device_copy(src, device, _val(node)), persistent=False)
        label = f"input {node.name}" if is_input else key[0]
        guard = ConstantGuard(name, label, src, src._version, _data_ptr(src), node.name if is_input else None)
        gm.meta[_GUARDS] = [*constant_guards(gm), guard]
    anchor = [n for n in gm.graph.nodes if n.op == "placeholder"][-1] if is_input else None
    with gm.graph.inserting_after(anchor) if is_input else gm.graph.inserting_before(node):
        new = gm.graph.get_attr(moved[key])
    new.meta = {**node.meta, "val": _on(_val(node), device)}
    node.replace_all_uses_with(new)
    if not is_input:
        gm.graph.erase_node(node)


def _free_name(gm: fx.GraphModule) -> str:
    index = 0
    while hasattr(gm, f"{_PREFIX}{index}"):
        index += 1
    return f"{_PREFIX}{index}"


def _same_meta(a: object, b: object) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if (a.dtype, a.layout, a.device) != (b.dtype, b.layout, b.device) or a.layout != torch.strided:
        return False
    return tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride())


def _fresh(node: fx.Node) -> bool:
    """A new tensor that aliases nothing (so a sole reader may keep it without a copy)."""
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and not target.is_view
        and _name(node) not in _MAY_ALIAS
    )


def _only_read(node: fx.Node) -> bool:
    """Every use of ``node`` (through views) only reads it: never written, never handed back to the caller."""
    for user in node.users:
        if user.op == "output" or not _pure(user):
            return False
        aliases = getattr(user.target, "is_view", False) or _name(user) in _MAY_ALIAS or user.target is operator.getitem
        if aliases and not _only_read(user):
            return False
    return True


def _drop_copy(gm: fx.GraphModule, node: fx.Node) -> None:
    """Drop a now same-device ``_to_copy`` that changes nothing, unless its source could then be written or leak."""
    if _name(node) != "_to_copy":
        return  # copy_ writes into its destination, to() may alias: both stay, now device-local
    src = node.args[0]
    if not _same_meta(_val(src), _val(node)):
        return  # it still casts or re-strides, on the device now
    if _only_read(node) or (_fresh(src) and len(src.users) == 1):
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
