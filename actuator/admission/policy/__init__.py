"""Admission control for shared GPUs: paper B's Algorithm 2, extended. Pure.

What each part decides, and why: docs/design-notes.md, "The admission policy".
"""
