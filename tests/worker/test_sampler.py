"""HeteroBatchSampler: equal step counts, exact epoch coverage, remainder rule, split changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_worker.sampler import HeteroBatchSampler


def samplers(n: int, batches: list[int], seed: int = 0) -> list[HeteroBatchSampler]:
    return [HeteroBatchSampler(n, batches, r, seed=seed) for r in range(len(batches))]


def one_epoch(all_ranks: list[HeteroBatchSampler]) -> list[list[list[int]]]:
    return [list(s) for s in all_ranks]


@pytest.mark.parametrize(("n", "batches"), [(47, [3, 5, 8, 4]), (18, [12, 6]), (100, [25, 25, 25, 25]),
                                            (1437, [64, 32, 16, 16])],
                         ids=["uneven 4 ranks with remainder 7", "case 15 split, no remainder",
                              "equal split", "digits split"])
def test_every_rank_takes_the_same_number_of_steps_and_covers_the_epoch_once(
        n: int, batches: list[int]) -> None:
    per_rank = one_epoch(samplers(n, batches))
    steps = n // sum(batches)
    assert [len(r) for r in per_rank] == [steps] * len(batches)
    for rank, batches_of_rank in enumerate(per_rank):
        assert all(len(b) == batches[rank] for b in batches_of_rank)
    seen = [i for r in per_rank for b in r for i in b]
    assert len(seen) == len(set(seen)) == steps * sum(batches)
    dropped = set(range(n)) - set(seen)
    assert len(dropped) == n % sum(batches)


def test_remainder_is_the_tail_of_the_seeded_permutation_and_changes_per_epoch() -> None:
    ranks = samplers(47, [3, 5, 8, 4], seed=9)
    order0 = ranks[0].permutation(0).tolist()
    first = {i for r in one_epoch(ranks) for b in r for i in b}
    assert set(range(47)) - first == set(order0[40:])
    second = {i for r in one_epoch(ranks) for b in r for i in b}
    assert ranks[0].epoch == 2
    assert set(range(47)) - second == set(ranks[0].permutation(1).tolist()[40:])
    assert first != second


def test_same_seed_same_order_on_every_rank_and_new_order_next_epoch() -> None:
    a, b = HeteroBatchSampler(30, [5, 5], 0, seed=3), HeteroBatchSampler(30, [5, 5], 1, seed=3)
    assert a.permutation(0).tolist() == b.permutation(0).tolist()
    assert a.permutation(0).tolist() != a.permutation(1).tolist()


def test_split_change_mid_epoch_still_covers_each_sample_once() -> None:
    ranks = samplers(101, [3, 5, 8, 4])
    iters = [iter(s) for s in ranks]
    seen: list[int] = []
    for step in range(5):
        if step == 2:
            for s in ranks:
                s.set_split([8, 4, 5, 3])
        batches = [next(it) for it in iters]
        assert [len(b) for b in batches] == ([3, 5, 8, 4] if step < 2 else [8, 4, 5, 3])
        seen += [i for b in batches for i in b]
    for it in iters:
        assert next(it, None) is None
    assert len(seen) == len(set(seen)) == 100


def test_global_batch_change_mid_epoch_ends_the_epoch_when_too_few_remain() -> None:
    ranks = samplers(50, [6, 4])
    iters = [iter(s) for s in ranks]
    seen = [i for it in iters for i in next(it)]
    for s in ranks:
        s.set_split([12, 8])  # B 10 -> 20: 40 left -> 2 more steps, nothing dropped
    while (batches := [next(it, None) for it in iters])[0] is not None:
        seen += [i for b in batches for i in b]
    assert len(seen) == len(set(seen)) == 50


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 60),
       st.integers(0, 3))
def test_property_disjoint_equal_counts(batches: list[int], extra: int, seed: int) -> None:
    n = sum(batches) + extra
    per_rank = one_epoch(samplers(n, batches, seed))
    assert len({len(r) for r in per_rank}) == 1
    seen = [i for r in per_rank for b in r for i in b]
    assert len(seen) == len(set(seen)) == n - n % sum(batches)


def test_state_dict_resumes_mid_epoch_at_the_same_batch() -> None:
    full = list(HeteroBatchSampler(60, [4, 6], 1, seed=2))
    first = HeteroBatchSampler(60, [4, 6], 1, seed=2)
    it = iter(first)
    head = [next(it), next(it)]
    resumed = HeteroBatchSampler(60, [4, 6], 1, seed=2)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == full


@pytest.mark.parametrize(("batches", "rank", "n"), [([0, 4], 0, 10), ([4], 1, 10), ([8, 8], 0, 10)],
                         ids=["batch below 1", "rank without a batch", "global batch > dataset"])
def test_rejects_bad_splits(batches: list[int], rank: int, n: int) -> None:
    with pytest.raises(ValueError):
        HeteroBatchSampler(n, batches, rank)


def test_refuses_a_checkpoint_of_another_dataset() -> None:
    state = HeteroBatchSampler(60, [4, 6], 0).state_dict()
    with pytest.raises(ValueError, match="60 samples"):
        HeteroBatchSampler(61, [4, 6], 0).load_state_dict(state)


def test_state_is_the_global_position_only() -> None:
    ranks = samplers(60, [4, 2])
    iters = [iter(s) for s in ranks]
    for _ in range(3):
        [next(it) for it in iters]
    states = [s.state_dict() for s in ranks]
    assert states[0] == states[1] == {"epoch": 0, "consumed": 18, "seed": 0, "shuffle": True,
                                      "num_samples": 60}


@pytest.mark.parametrize(("before", "after"), [([8, 6, 4], [10, 8]), ([10, 8], [8, 6, 4]),
                                               ([8, 6, 4], [5, 5, 5, 5])],
                         ids=["one rank fewer", "one rank more", "more ranks, larger batch"])
def test_resume_under_another_split_covers_the_epoch_exactly(before: list[int],
                                                             after: list[int]) -> None:
    n = 110
    old = samplers(n, before, seed=4)
    iters = [iter(s) for s in old]
    seen = [i for _ in range(2) for it in iters for i in next(it)]
    position = old[0].state_dict()
    new = samplers(n, after, seed=4)
    for s in new:
        s.load_state_dict(position)
    per_rank = one_epoch(new)
    assert len({len(r) for r in per_rank}) == 1  # same step count on every new rank
    seen += [i for r in per_rank for b in r for i in b]
    assert len(seen) == len(set(seen))
    dropped = set(range(n)) - set(seen)  # remainder rule under the new global batch
    assert len(dropped) == (n - 2 * sum(before)) % sum(after)
    assert dropped == set(new[0].permutation(0).tolist()[n - len(dropped):])
    assert all(s.epoch == 1 for s in new)


def test_position_of_another_dataset_is_refused() -> None:
    state = HeteroBatchSampler(60, [4, 2], 0).state_dict()
    with pytest.raises(ValueError, match="for 60 samples, seed 0, shuffle True"):
        HeteroBatchSampler(61, [4, 2], 0).load_state_dict(state)
    with pytest.raises(ValueError, match="this sampler has 60, 0, False"):
        HeteroBatchSampler(60, [4, 2], 0, shuffle=False).load_state_dict(state)
