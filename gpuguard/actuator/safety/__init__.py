"""What keeps tenants from being left paused: the journal written before every action, the
leases between the actuator and its guard, the pause clock behind ``--max-pause``,
reconciling the journal with the engine at start, and failing open.
"""
