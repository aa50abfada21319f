"""`planner replay`: trace-driven what-if simulation of serving engines that
call the same policy functions the service calls (DESIGN.md §4)."""
