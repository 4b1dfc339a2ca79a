"""Stand-ins for services the benches and tests need to misbehave on purpose."""
