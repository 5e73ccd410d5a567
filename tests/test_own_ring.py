"""Lesson 14's rank-level exercise (d2l_gpu.parallel.own_ring): a student's hop of ring
attention's ring, shipped as source text to 4 gloo ranks that train the context-parallel
transformer with it. The course's own hop equals one device in float64; a ring turned the wrong
way (the negative control: with 2 ranks it would pass) and a hop that sends nothing train
another model; a hop that returns no works is said as each rank's error; the unanswered starter
returns ...; the course's hop is back in place afterwards."""

import inspect

import pytest

from d2l_gpu.parallel import context_parallel, own_ring, workload
from d2l_gpu.workers import run_workers

WORK = workload.TransformerWorkload(seq_len=16, steps=3)  # float64, 4 heads, 2 layers
RIGHT = inspect.getsource(context_parallel._pass_on)  # the course's own hop
REVERSED = RIGHT.replace("(rank + 1) % world", "NEXT").replace("(rank - 1) % world", "PREVIOUS")
REVERSED = REVERSED.replace("NEXT", "(rank - 1) % world").replace("PREVIOUS", "(rank + 1) % world")
KEEPS = "def pass_on(t):\n    return t, []\n"  # sends nothing: every rank keeps its own block
NO_WORKS = "def pass_on(t):\n    return t, None\n"
STARTER = "def pass_on(t):\n    return ...  # TODO\n"


def five_answers(rank, world):
    """Each answer in turn in one process group, and whether the course's hop came back."""
    course = context_parallel._pass_on
    out = {
        name: own_ring.own_ring_worker(rank, world, source, WORK)
        for name, source in (("right", RIGHT), ("reversed", REVERSED), ("keeps", KEEPS),
                             ("no works", NO_WORKS), ("starter", STARTER))
    }  # fmt: skip
    out["restored"] = context_parallel._pass_on is course
    return out


@pytest.fixture(scope="module")
def answers():
    return run_workers(five_answers, 4)


def test_the_right_hop_trains_as_one_device(answers):
    assert REVERSED != RIGHT
    for rank in answers:
        assert (
            rank["right"]["equal"] and rank["right"]["gap"] < 1e-12 and not rank["right"]["error"]
        )


@pytest.mark.parametrize("wrong", ["reversed", "keeps"])
def test_a_wrong_ring_trains_another_model(answers, wrong):
    for rank in answers:
        assert not rank[wrong]["equal"] and rank[wrong]["gap"] > 1e-6


def test_an_answer_that_raises_is_said_for_each_rank(answers):
    for rank in answers:
        said = rank["no works"]["error"]
        assert not rank["no works"]["equal"] and "ranks 0, 1, 2, 3 raised TypeError" in said


def test_the_starter_is_unanswered_and_the_course_hop_comes_back(answers):
    assert all(rank["starter"] is ... and rank["restored"] for rank in answers)


def test_two_ranks_and_not_source_text_are_refused_in_a_sentence():
    with pytest.raises(ValueError, match="own_ring_worker: world"):
        own_ring.own_ring_worker(0, 2, RIGHT, WORK)  # next and previous would be the same rank
    with pytest.raises(TypeError, match="source must be the source text of a function f"):
        own_ring.own_ring_worker(0, 4, "pass_on", WORK)
