"""Topologies read from the machines: `tag topology probe` (one machine, from nvidia-smi and sysfs, or a
recorded folder of their outputs), and `discover` (probes, a Slurm allocation or a Kubernetes node list
merged into one validated snapshot). Every figure is nominal until `tag calibrate` measures it."""
