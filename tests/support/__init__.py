"""Test-only support code (throwaway PostgreSQL clusters and helpers)."""
