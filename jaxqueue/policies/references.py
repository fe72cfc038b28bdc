"""The papers the policies and formulas come from (cited by key in each policy)."""

from __future__ import annotations

__all__ = ["REFERENCES", "cite"]

#: key -> (short citation as docstrings write it, full reference).
REFERENCES = {
    "wang2017": (
        "Wang, Feng and Cheng",
        'C. Wang, C. Feng, J. Cheng, "Distributed Join-the-Idle-Queue for Low Latency Cloud '
        'Services", arXiv:1709.10119',
    ),
    "liu2019": (
        "Liu and Ying",
        'X. Liu, L. Ying, "On Universal Scaling of Distributed Queues under Load Balancing", '
        "arXiv:1912.11904",
    ),
    "mukherjee2015": (
        "Mukherjee et al.",
        'D. Mukherjee, S. C. Borst, J. S. H. van Leeuwaarden, P. A. Whiting, "Universality of '
        'load balancing schemes on the diffusion scale", arXiv:1510.02657',
    ),
    "mitzenmacher2016": (
        "Mitzenmacher",
        'M. Mitzenmacher, "Analyzing Distributed Join-Idle-Queue: A Fluid Limit Approach", '
        "arXiv:1606.01833",
    ),
    "lu2011": (
        "Lu et al.",
        'Y. Lu, Q. Xie, G. Kliot, A. Geller, J. R. Larus, A. Greenberg, "Join-Idle-Queue: A '
        'novel load balancing algorithm for dynamically scalable web services", Performance '
        "Evaluation 68(11), 2011",
    ),
    "whitt1986": (
        "Whitt",
        'W. Whitt, "Deciding which queue to join: some counterexamples", Operations Research '
        "34(1), 1986",
    ),
    "mitzenmacher2001": (
        "Mitzenmacher",
        'M. Mitzenmacher, "The power of two choices in randomized load balancing", IEEE '
        "Transactions on Parallel and Distributed Systems 12(10), 2001",
    ),
}


def cite(key: str) -> str:
    """The full reference of ``key``."""
    return REFERENCES[key][1]
