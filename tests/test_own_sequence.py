"""Lesson 13's rank-level exercise (d2l_gpu.parallel.own_sequence): a student's reduce-scatter
along the sequence, shipped as source text to 2 gloo ranks that train the sequence-parallel
transformer with it. The course's own function equals one device in float64; a function that
keeps its slice without summing (the negative control) trains another model; one that scatters
along the batch is said as each rank's error; the unanswered starter returns ...; the course's
function is back in place afterwards."""

import inspect

import pytest

from d2l_gpu.parallel import own_sequence, sequence_parallel, workload
from d2l_gpu.workers import run_workers

WORK = workload.TransformerWorkload(seq_len=16, steps=3)  # float64, 4 heads, 2 layers
HEAD = "def reduce_scatter_seq(x):\n"
RIGHT = inspect.getsource(sequence_parallel._reduce_scatter_seq)  # the course's own
NO_SUM = HEAD + "    return x.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()\n"
BATCH = HEAD + (
    "    out = torch.empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]), dtype=x.dtype)\n"
    "    dist.reduce_scatter_tensor(out, x.contiguous())\n"
    "    return out\n"
)
STARTER = HEAD + "    return ...  # TODO\n"


def four_answers(rank, world):
    """Each answer in turn in one process group, and whether the course's function came back."""
    course = sequence_parallel._reduce_scatter_seq
    out = {
        name: own_sequence.own_sequence_worker(rank, world, source, WORK)
        for name, source in (("right", RIGHT), ("no sum", NO_SUM), ("batch", BATCH),
                             ("starter", STARTER))
    }  # fmt: skip
    out["restored"] = sequence_parallel._reduce_scatter_seq is course
    return out


@pytest.fixture(scope="module")
def answers():
    return run_workers(four_answers, 2)


def test_the_right_reduce_scatter_trains_as_one_device(answers):
    for rank in answers:
        assert (
            rank["right"]["equal"] and rank["right"]["gap"] < 1e-12 and not rank["right"]["error"]
        )


def test_keeping_the_slice_without_the_sum_trains_another_model(answers):
    for rank in answers:
        assert not rank["no sum"]["equal"] and rank["no sum"]["gap"] > 1e-6


def test_an_answer_that_raises_is_said_for_each_rank(answers):
    for rank in answers:
        said = rank["batch"]["error"]
        assert not rank["batch"]["equal"] and "rank 0" in said and "rank 1" in said


def test_the_starter_is_unanswered_and_the_course_function_comes_back(answers):
    assert all(rank["starter"] is ... and rank["restored"] for rank in answers)


def test_not_source_text_is_refused_in_a_sentence():
    with pytest.raises(TypeError, match="source must be the source text of a function f"):
        own_sequence.own_sequence_worker(0, 2, "reduce_scatter_seq", WORK)  # before any group
    with pytest.raises(ValueError, match="own_sequence_worker: world"):
        own_sequence.own_sequence_worker(0, 1, RIGHT, WORK)  # one rank has nothing to scatter
