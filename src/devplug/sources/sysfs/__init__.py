"""Devices read in sysfs: USB and PCI devices, their /dev nodes, NUMA node and PCI
topology, with settable sysfs and /dev roots so that fake trees can stand in."""

from devplug.sources.sysfs.tree import SysDevice, Sysfs

__all__ = ["SysDevice", "Sysfs"]
