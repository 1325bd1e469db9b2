"""The generic device plugin's own `--device` examples (squat/generic-device-plugin, main
branch), transcribed as test inputs: the blocks of its DaemonSet manifest
(manifests/generic-device-plugin.yaml) and the examples of its README and `--help`."""

from __future__ import annotations

# manifests/generic-device-plugin.yaml: the `args` of its container, one block per --device.
MANIFEST_DEVICES = [
    """\
name: serial
groups:
  - paths:
      - path: /dev/ttyUSB*
  - paths:
      - path: /dev/ttyACM*
  - paths:
      - path: /dev/tty.usb*
  - paths:
      - path: /dev/cu.*
  - paths:
      - path: /dev/cuaU*
  - paths:
      - path: /dev/rfcomm*
""",
    """\
name: video
groups:
  - paths:
      - path: /dev/video0
""",
    """\
name: fuse
groups:
  - count: 10
    paths:
      - path: /dev/fuse
""",
    """\
name: audio
groups:
  - count: 10
    paths:
      - path: /dev/snd
""",
    """\
name: capture
groups:
  - paths:
      - path: /dev/snd/controlC0
      - path: /dev/snd/pcmC0D0c
  - paths:
      - path: /dev/snd/controlC1
        mountPath: /dev/snd/controlC0
      - path: /dev/snd/pcmC1D0c
        mountPath: /dev/snd/pcmC0D0c
  - paths:
      - path: /dev/snd/controlC2
        mountPath: /dev/snd/controlC0
      - path: /dev/snd/pcmC2D0c
        mountPath: /dev/snd/pcmC0D0c
  - paths:
      - path: /dev/snd/controlC3
        mountPath: /dev/snd/controlC0
      - path: /dev/snd/pcmC3D0c
        mountPath: /dev/snd/pcmC0D0c
""",
]

# README.md and the --device help text, in order.
README_DEVICES = {
    "video": '{"name": "video", "groups": [{"paths": [{"path": "/dev/video0"}]}]}',
    "serial": '{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}, '
    '{"paths": [{"path": "/dev/ttyACM*"}]}]}',
    "capture": '{"name": "capture", "groups": [{"paths": [{"path": "/dev/snd/pcmC0D0c"}, '
    '{"path": "/dev/snd/controlC0"}]}]}',
    "ch340": '{"name": "ch340", "groups": [{"usb": [{"vendor": "1a86", "product": "7523"}]}]}',
    "fuse": '{"name": "fuse", "groups": [{"count": 10, "paths": [{"path": "/dev/fuse"}]}]}',
    "optional": '{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyS0", "optional": '
    'true}, {"path": "/dev/ttyUSB0", "optional": true}]}]}',
    "folder": '{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*", "mountPath": '
    '"/dev/serial/"}]}]}',
    # The help text's USB form: two entries in one group, the second with a serial.
    "usb": '{"name": "usb", "groups": [{"usb": [{"vendor": "1209", "product": "000F"}, '
    '{"vendor": "1209", "product": "000F", "serial": "00000001"}]}]}',
}
