"""This process's resident memory in MiB (/proc/self/status VmRSS), for the scripts beside this file."""


def rss() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
