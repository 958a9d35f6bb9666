"""The lifecycle suite: what each job costs the server, in counts."""
