"""CPU tests of the split search (``launchless.runtime.split``): which submodules become pieces, how refused pieces are
expanded down the module tree, and how calls are routed to pieces and back. A piece here is a test double that
"refuses" the modules marked ``blocked`` and otherwise runs the submodule's own forward; the real piece (a
``GraphedModule`` over the submodule) is exercised by the ``cuda`` tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launchless.core.signature import flatten_inputs
from launchless.runtime.split import EagerPart, SplitForward, is_container, worth_a_graph


class FakePiece:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.forward = module.__dict__.get("forward") or type(module).forward.__get__(module)
        self.calls = 0
        self.released = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.forward(*args, **kwargs)

    def graph_info(self) -> dict:
        blocked = getattr(self.module, "blocked", None)
        if self.calls and blocked:
            row = {"stage": blocked, "reason": f"{blocked} blocker", "source": "model.py:7", "transient": False}
            return {"graphs": [], "fallbacks": [row]}
        graphs = [{"replays": self.calls, "verification": {"status": "bit-identical"}}] if self.calls else []
        return {"graphs": graphs, "fallbacks": []}

    def release_graphs(self) -> None:
        self.released += 1


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Block(nn.Module):
    blocked = "capture"  # e.g. a host copy in its own code

    def __init__(self) -> None:
        super().__init__()
        self.a, self.act, self.b = nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x))) + float(x.sum() > 0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.body = Block()
        self.heads = nn.ModuleList([Head(), Head()])
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.act(self.stem(x))
        x = self.body(x)
        assert isinstance(self.body, Block) and len(self.heads) == 2  # the parent's code sees its own modules
        return [head(x) for head in self.heads]


def split_of(model: nn.Module) -> SplitForward:
    return SplitForward(
        model, name="Net.forward", why=EagerPart("", "Net", "host copy", "net.py:3"), make_piece=FakePiece
    )


def no_routes_left(model: nn.Module) -> bool:
    return not any("forward" in m.__dict__ for m in model.modules())


def test_pieces_are_the_submodules_worth_a_graph_and_containers_are_looked_through() -> None:
    split = split_of(Net())
    assert list(split.pieces) == ["stem", "body", "heads.0", "heads.1"]  # no ReLU, no ModuleList itself
    assert worth_a_graph(nn.Linear(2, 2)) and not worth_a_graph(nn.ReLU()) and not worth_a_graph(nn.ModuleList())
    assert is_container(nn.ModuleDict()) and not is_container(nn.Sequential())


def test_the_search_expands_refused_pieces_and_runs_the_model_as_eager_would() -> None:
    torch.manual_seed(0)
    model = Net()
    split = split_of(model)
    x = torch.randn(5, 4)
    split.search(flatten_inputs((x,), {}))
    out = split.run((x,), {})
    assert list(split.pieces) == ["stem", "heads.0", "heads.1", "body.a", "body.b"]
    assert [p.module or "(root)" for p in split.eager.values()] == ["(root)", "body"]
    assert split.eager["body"] == EagerPart("body", "Block", "capture blocker", "model.py:7")
    assert all(torch.equal(a, b) for a, b in zip(out, model(x), strict=True))
    assert no_routes_left(model), "a route outlived the call"
    calls = {path: piece.calls for path, piece in split.pieces.items()}
    split.run((x,), {})
    assert {path: piece.calls - calls[path] for path, piece in split.pieces.items()} == dict.fromkeys(split.pieces, 1)
    assert not split.refine()


def test_a_refusal_a_split_cannot_work_around_is_not_expanded() -> None:
    model = Net()
    model.body.blocked = "no CUDA device"
    split = split_of(model)
    split.search(flatten_inputs((torch.randn(2, 4),), {}))
    assert "body" in split.eager and not any(path.startswith("body.") for path in split.pieces)


def test_routes_are_removed_when_the_forward_raises_and_a_users_own_forward_is_kept() -> None:
    model = Net()
    own = model.stem.forward = lambda x: torch.zeros(x.shape[0], 8)  # the user's instance forward, made before
    split = split_of(model)
    assert split.pieces["stem"].forward is own, "the piece runs the user's own forward"

    def broken(x):
        raise RuntimeError("the parent's own bug")

    model.heads[1].forward = broken  # given after the split was made: it runs (eager), not the piece
    with pytest.raises(RuntimeError, match="the parent's own bug"):
        split.run((torch.randn(2, 4),), {})
    assert model.stem.__dict__["forward"] is own and model.heads[1].__dict__["forward"] is broken
    assert split.pieces["heads.1"].calls == 0


def test_a_module_shared_by_two_paths_is_one_piece_serving_both() -> None:
    model = Net()
    model.heads[1] = model.heads[0]
    split = split_of(model)
    assert "heads.0" in split.pieces and "heads.1" not in split.pieces
    out = split.run((torch.randn(3, 4),), {})
    assert torch.equal(out[0], out[1]) and split.pieces["heads.0"].calls == 2 and no_routes_left(model)

    class TwoParents(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            shared = Head()
            self.left, self.right = nn.Sequential(shared), nn.Sequential(shared)
            self.left.blocked = self.right.blocked = "capture"

        def forward(self, x):
            return self.left(x) + self.right(x)

    model = TwoParents()
    split = split_of(model)
    x = torch.randn(2, 8)
    split.search(flatten_inputs((x,), {}))
    assert torch.equal(split.run((x,), {}), model(x))
    assert {"left.0", "right.0"} <= set(split.pieces) and no_routes_left(model)
    assert (split.pieces["left.0"].calls, split.pieces["right.0"].calls) == (4, 0), "one piece serves both calls"


def test_info_lists_pieces_eager_parts_and_release_frees_every_piece() -> None:
    model = Net()
    split = split_of(model)
    split.search(flatten_inputs((torch.randn(2, 4),), {}))
    info = split.info(str)
    assert [row["module"] for row in info["pieces"]] == list(split.pieces)
    assert all(row["graphs"] == 1 and row["verification"] == ["bit-identical"] for row in info["pieces"])
    assert info["eager"][0] == {"module": "(root)", "type": "Net", "reason": "host copy", "source": "net.py:3"}
    assert info["signatures"] == []
    assert split.describe() == "pieces that replay: stem, heads.0, heads.1, body.a, body.b; eager: (root), body"
    split.release()
    assert all(piece.released == 1 for piece in split.pieces.values())


def test_the_search_runs_on_copies_of_the_callers_tensors() -> None:
    model = Net()
    seen: list[int] = []
    model.stem.register_forward_pre_hook(lambda mod, args: seen.append(args[0].data_ptr()))
    split = split_of(model)
    x = torch.randn(2, 4)
    split.search(flatten_inputs((x,), {}))
    assert seen and x.data_ptr() not in seen, "a search run used the caller's own tensor"
