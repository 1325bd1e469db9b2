"""Capacity questions: a workload against a fleet, with the knobs devplug controls.

The planner reads the fleet (`devplug.fleet`), never the other way: each run builds
the fleet's nodes, places the workload's pods (the fit step, or the real scheduler
through an API server) and reports what each pool has used, left free and stranded.
`devplug plan` is the command (docs/fleet.md).
"""
