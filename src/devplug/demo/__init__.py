"""`devplug demo`: a simulated kubelet, the default plugins as a real process, sample pods.

    from devplug.demo import run_demo

    code = run_demo()                 # the story on stdout; 0 when it went through
    code = run_demo("json")           # the same facts, one JSON object per line

The scenario is in `devplug.demo.script`, the output in `devplug.demo.view`, the pods
it applies in `devplug/demo/pods.yaml`.
"""

from devplug.demo.script import run_demo, sample_pods

__all__ = ["run_demo", "sample_pods"]
