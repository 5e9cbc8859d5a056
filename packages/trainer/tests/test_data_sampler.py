"""ResumableSampler: deterministic epochs and exact resumption."""

from __future__ import annotations

import itertools

import pytest

from grpo_trainer.data import ResumableSampler


def take_epochs(sampler, epochs):
    return [batch for _ in range(epochs) for batch in sampler]


def test_epochs_are_deterministic_permutations_that_differ():
    a = ResumableSampler(10, batch_size=3, seed=7, shuffle=True)
    b = ResumableSampler(10, batch_size=3, seed=7, shuffle=True)
    epoch0, epoch1 = list(a), list(a)
    assert epoch0 == list(b) and epoch1 == list(b)
    assert len(epoch0) == len(a) == 3  # drop_last: 9 of 10 indices
    flat = list(itertools.chain(*epoch0))
    assert len(set(flat)) == 9 and set(flat) <= set(range(10))
    assert epoch0 != epoch1
    assert list(ResumableSampler(10, batch_size=3, seed=8, shuffle=True)) != epoch0


def test_no_shuffle_and_keep_last():
    s = ResumableSampler(7, batch_size=3, seed=0, shuffle=False, drop_last=False)
    assert len(s) == 3
    assert list(s) == [[0, 1, 2], [3, 4, 5], [6]]
    assert s.epoch == 1 and s.position == 0


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4, 7])
def test_resume_yields_exactly_the_remaining_batches(stop_after):
    reference = take_epochs(ResumableSampler(11, batch_size=4, seed=3, shuffle=True), 4)  # 2 batches an epoch

    first = ResumableSampler(11, batch_size=4, seed=3, shuffle=True)
    seen = []
    while len(seen) < stop_after:  # a batch counts as used once it has been handed out
        for batch in first:
            seen.append(batch)
            if len(seen) == stop_after:
                break
    state = first.state_dict()

    resumed = ResumableSampler(11, batch_size=4, seed=3, shuffle=True)
    resumed.load_state_dict(state)
    rest = []
    while len(seen) + len(rest) < len(reference):
        rest.extend(resumed)
    assert seen + rest == reference


def test_state_saved_after_the_last_batch_of_an_epoch_continues_with_the_next_epoch():
    reference = take_epochs(ResumableSampler(8, batch_size=4, seed=1, shuffle=True), 2)
    s = ResumableSampler(8, batch_size=4, seed=1, shuffle=True)
    it = iter(s)
    next(it), next(it)  # both batches of epoch 0 handed out; the generator has not finished yet
    state = s.state_dict()
    assert (state["epoch"], state["position"]) == (0, 8)
    resumed = ResumableSampler(8, batch_size=4, seed=1, shuffle=True)
    resumed.load_state_dict(state)
    assert list(resumed) == []  # the rest of epoch 0 is empty
    assert list(resumed) == reference[2:]


def test_load_state_rejects_other_settings_and_bad_positions():
    s = ResumableSampler(8, batch_size=4, seed=1, shuffle=True)
    state = s.state_dict()
    with pytest.raises(ValueError, match="seed=1 but this run has seed=2"):
        ResumableSampler(8, batch_size=4, seed=2, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="n=8"):
        ResumableSampler(9, batch_size=4, seed=1, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="invalid sampler state"):
        s.load_state_dict({"epoch": 0, "position": 99})


def test_too_little_data_for_one_batch():
    with pytest.raises(ValueError, match="cannot fill one batch"):
        ResumableSampler(3, batch_size=4, seed=0, shuffle=True)
    assert len(ResumableSampler(3, batch_size=4, seed=0, shuffle=True, drop_last=False)) == 1
