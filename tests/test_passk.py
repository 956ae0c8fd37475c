from itertools import combinations

import pytest

from thresher.evaluators.passk import pass_at_k


def brute_force(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_every_k_subset(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_large_n_is_stable():
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)
    assert 0.0 < pass_at_k(100_000, 3, 100) < 1.0
    assert pass_at_k(200, 0, 100) == 0.0 and pass_at_k(200, 150, 100) == 1.0


def test_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)
