"""A student's pipeline stage on real ranks (lesson 10, exercise 5): the right answer trains as
one device does and sends each activation forward and its gradient back once per step; plausible
wrong ones are refused: a received activation without requires_grad_ (a sentence, no hang), the
loss summed instead of averaged, a gradient never sent back (a receive that gives up, no hang)."""

from answers import l10

from d2l_gpu.parallel import workload
from d2l_gpu.parallel.own_stage import own_stage_worker
from d2l_gpu.workers import run_workers

WORK = workload.Workload(widths=(8, 16, 16, 4), steps=3, batch_size=6)

HEADER = "def stage_step(stage, X, y, rank, world, width):\n"
RIGHT = HEADER + l10.STAGE_STEP.format("") + "\n"
SUMMED = HEADER + l10.STAGE_STEP.format(', reduction="sum"') + "\n"
NO_GRAD = RIGHT.replace("        h.requires_grad_()\n", "")
NEVER_BACK = RIGHT.replace("    if rank > 0:\n", "    if rank > 0 and rank < world - 1:\n")
assert NO_GRAD != RIGHT != NEVER_BACK  # each mistake is really made
STARTER = HEADER + "    return ...\n"


def trials(rank, world, sources):
    """own_stage_worker for each source, one after the other, in one process group. Only the
    answers that lose a message wait their time out: 2 s for those, a minute for the others, so
    that a busy machine cannot make a right answer's late message look lost."""
    lose = (NO_GRAD, NEVER_BACK)
    return [own_stage_worker(rank, world, s, WORK, 2.0 if s in lose else 60.0) for s in sources]


def test_the_right_stage_step_trains_as_one_device_and_sends_each_tensor_once():
    right, summed, starter = run_workers(trials, 3, [RIGHT, SUMMED, STARTER], backend="gloo")[0]
    assert right["equal"] and right["error"] is None
    assert right["forward"] == [3 * a for a in right["activations"]]  # 3 steps
    assert right["backward"] == [0] + [3 * a for a in right["activations"][:-1]]
    assert right["activations"] == [6 * 16 * 8, 6 * 16 * 8, 0]  # the cuts of (8, 16, 16, 4)
    assert not summed["equal"] and summed["error"] is None  # the negative control: 6 x the mean's
    assert starter is ...


def test_a_stage_step_that_loses_a_message_fails_with_a_sentence_and_the_group_goes_on():
    no_grad, never_back, right = run_workers(trials, 3, [NO_GRAD, NEVER_BACK, RIGHT])[0]
    assert not no_grad["equal"] and "needs requires_grad_() before" in no_grad["error"]
    assert not never_back["equal"]
    assert "rank 2 -> rank 1" in never_back["error"]  # the gradient rank 2 never sent
    assert right["equal"]  # the same processes, afterwards
