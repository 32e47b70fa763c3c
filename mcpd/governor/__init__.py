"""The governor process, `mcpd run`'s main process: sensors sampled, the policy (the top-level
`governors` package) applied to the frequency caps, the baseline kept for restore, the serving
process supervised, systemd told how it goes. Nothing here imports the serving stack
(pyproject.toml's import-linter contracts check it); what both processes share (config, the status
contract, the IPC protocol, the listening sockets) sits one level up, in `mcpd`."""
