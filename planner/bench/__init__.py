"""`planner bench`: measured speed, never asserted in unit tests."""
