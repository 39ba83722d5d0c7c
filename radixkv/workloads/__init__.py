"""Workloads for benchmarks and tests: real request traces and synthetic chat traces."""
