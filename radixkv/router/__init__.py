"""Routing requests over replicas: where a prompt's prefix is already cached."""

from radixkv.router.policy import POLICIES, ApproxTree, CacheAware, LeastLoad, RoundRobin, RoutingPolicy, make_policy

__all__ = ["POLICIES", "ApproxTree", "CacheAware", "LeastLoad", "RoundRobin", "RoutingPolicy", "make_policy"]
