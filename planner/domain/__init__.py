"""Plain data the policies take and return; mirrors proto/planner/v1."""
