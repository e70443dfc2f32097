"""The router: which actor runs which cohort member (pure bookkeeping; the Ray runs that show the numbers do not
depend on it are the conformance suite's Ray case and tests/actors/test_ray_backend.py)."""

from __future__ import annotations

import random

from fedcomp.actors.routing import Router

GROUPS = [list(range(0, 50)), list(range(50, 100))]


def loads(members: dict[int, list[int]], actors: int = 2) -> list[int]:
    return [len(members.get(i, [])) for i in range(actors)]


def free(router: Router, program: str = "local_steps") -> Router:
    router.learn(program, {0: [0]}, {0: False})
    return router


def test_the_first_call_of_a_program_goes_home_then_a_free_program_is_spread_evenly() -> None:
    router = Router(GROUPS)
    cohort = [3, 7, 12, 40, 41, 44, 60, 70, 2, 9]  # 8 hosted by actor 0, 2 by actor 1
    first = router.assign("local_steps", cohort)
    assert first == {0: [3, 7, 12, 40, 41, 44, 2, 9], 1: [60, 70]}
    router.learn("local_steps", first, {0: False, 1: False})
    assert router.free == {"local_steps"}
    assert router.assign("local_steps", cohort) == {0: [3, 12, 41, 60, 2], 1: [7, 40, 44, 70, 9]}


def test_balanced_loads_differ_by_at_most_one_and_keep_cohort_order() -> None:
    rng = random.Random(0)
    router = free(Router([range(0, 40), range(40, 70), range(70, 100)]))
    for _ in range(200):
        cohort = rng.sample(range(100), rng.randint(1, 30))
        members = router.assign("local_steps", cohort)
        sizes = loads(members, 3)
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(cohort)
        assert all(m == [c for c in cohort if c in m] for m in members.values())


def test_a_cohort_smaller_than_the_actors_goes_round_them_across_calls() -> None:
    router = free(Router([[c] for c in range(8)]))
    used = [sorted(router.assign("local_steps", [5, 1, 6])) for _ in range(8)]
    assert used[:3] == [[0, 1, 2], [3, 4, 5], [0, 6, 7]]
    assert {a for call in used for a in call} == set(range(8))


def test_clients_with_private_state_stay_where_it_is_and_the_program_is_not_free() -> None:
    router = Router(GROUPS)
    cohort = [1, 2, 3, 4, 60]
    first = router.assign("local_steps", cohort)
    router.learn("local_steps", first, {0: True, 1: True})
    assert router.stateful == {"local_steps"} and not router.free
    assert router.assign("local_steps", cohort) == first
    assert router.held_by(0) == [1, 2, 3, 4] and router.held_by(1) == [60]


def test_a_free_program_keeps_held_clients_on_their_holder_and_fills_around_them() -> None:
    router = free(Router(GROUPS), "outer")
    router.learn("inner", {0: [1, 2, 3]}, {0: True})  # a stateful program left state for 1, 2, 3 on actor 0
    members = router.assign("outer", [1, 2, 3, 4, 5, 6])
    assert members == {0: [1, 2, 3], 1: [4, 5, 6]}


def test_a_call_that_leaves_no_state_releases_its_clients() -> None:
    router = Router(GROUPS)
    router.learn("a", {1: [55, 56]}, {1: True})
    router.learn("b", {1: [55]}, {1: False})
    assert router.holder == {56: 1}


def test_a_free_program_that_starts_leaving_state_becomes_stateful_for_good() -> None:
    router = free(Router(GROUPS), "p")
    assert router.free == {"p"}
    router.learn("p", {0: [1], 1: [2]}, {0: False, 1: True})
    assert router.free == set() and router.stateful == {"p"} and router.holder == {2: 1}
    router.learn("p", {0: [3]}, {0: False})
    assert router.free == set()


def test_home_routing_never_moves_a_client() -> None:
    router = free(Router(GROUPS, "home"))
    assert router.assign("local_steps", list(range(10))) == {0: list(range(10))}


def test_restored_states_go_home_and_replace_what_was_held() -> None:
    router = Router(GROUPS)
    router.learn("p", {1: [3]}, {1: True})
    assert router.place([70, 5]) == {0: [5], 1: [70]}
    assert router.holder == {5: 0, 70: 1}


def test_with_pinned_clients_the_others_even_out_the_loads() -> None:
    rng = random.Random(1)
    router = free(Router([range(0, 30), range(30, 60), range(60, 100)]))
    router.learn("inner", {0: [0, 1]}, {0: True})  # 0 and 1 hold private state on actor 0
    for _ in range(50):
        cohort = [0, 1, *rng.sample(range(2, 100), rng.randint(4, 20))]
        members = router.assign("local_steps", cohort)
        sizes = loads(members, 3)
        assert members[0][:2] == [0, 1] and max(sizes) - min(sizes) <= 1
