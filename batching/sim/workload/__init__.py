"""Request streams: synthetic workloads, sessions, prefix chains and trace import."""
