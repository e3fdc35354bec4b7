"""Plan, apply, roll back and verify: the engine, its state directory, journal, setting types and --persist."""
