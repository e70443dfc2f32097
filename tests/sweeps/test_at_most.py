"""The capped schedulers' decisions, on Tune's own trial records (stubs: no trainable behind them); a real resumed
sweep's trials held to ``max_concurrent`` is tests/platform/test_user_modules.py's alike test."""

from __future__ import annotations

from ray.tune.experiment import Trial

from fedcomp.sweeps.at_most import AshaAtMost, FifoAtMost


class Trials:
    """What a scheduler asks of Tune's controller here: the trials, in the order Tune added them."""

    def __init__(self) -> None:
        self.trials: list[Trial] = []

    def get_trials(self) -> list[Trial]:
        return self.trials

    def add(self, scheduler: FifoAtMost | AshaAtMost) -> Trial:
        trial = Trial("fedcomp_stub", stub=True)
        self.trials.append(trial)
        scheduler.on_trial_add(self, trial)
        return trial


def test_added_trials_wait_and_start_in_order_while_fewer_than_the_cap_run():
    scheduler, controller = FifoAtMost(at_most=2), Trials()
    first, second, third = (controller.add(scheduler) for _ in range(3))
    assert [t.status for t in controller.trials] == [Trial.PAUSED] * 3  # none starts unless chosen
    assert scheduler.choose_trial_to_run(controller) is first
    first.set_status(Trial.PENDING)  # what Tune does with the chosen trial
    assert scheduler.choose_trial_to_run(controller) is second
    second.set_status(Trial.RUNNING)
    assert scheduler.choose_trial_to_run(controller) is None  # two staged or running: the cap
    first.set_status(Trial.TERMINATED)
    assert scheduler.choose_trial_to_run(controller) is third


def test_a_trial_tune_retries_keeps_its_place_and_asha_is_capped_alike():
    scheduler, controller = AshaAtMost(time_attr="trial_round", max_t=4, grace_period=1, at_most=1), Trials()
    scheduler.set_search_properties("test_accuracy", "max")
    running, waiting = controller.add(scheduler), controller.add(scheduler)
    running.set_status(Trial.RUNNING)
    scheduler.on_trial_error(controller, running)  # Tune then files it as pending and adds it again at once
    running.set_status(Trial.PENDING)
    scheduler.on_trial_add(controller, running)
    assert running.status == Trial.PENDING and waiting.status == Trial.PAUSED
    assert scheduler.choose_trial_to_run(controller) is None
