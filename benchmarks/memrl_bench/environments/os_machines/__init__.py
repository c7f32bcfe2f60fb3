"""The LLB-OS machines, one per sample (`os_sandbox.SandboxFactory`): the machine's contract and limits
(`os_machine`), the Debian root file system (`os_rootfs`), the cgroup (`os_cgroup`), running a script from
the host (`os_exec`, over `os_enter.py`, which runs standalone by path), and the two backends (`os_bwrap`,
`os_docker`)."""
