"""Carrying decisions out: pause and unpause (vet, record, act, settle), and reconciling."""
