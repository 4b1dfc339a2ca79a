"""``bench/traces.py``'s pure parts: production traces into server schedules, and judging."""
