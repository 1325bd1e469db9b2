"""The scheduler extender: the kube-scheduler's HTTP extender (filter, prioritize,
bind) placing shares of GPUs with devplug.placement's policies, over the GPU
inventories nodes publish and the choices recorded on pods (docs/placement.md)."""
