package contract

// AgentParam is the kernel command line parameter naming the kiln agent a
// release's boot entry runs (kiln.agent=sha256:HEX): the node writes it
// into the entries it makes, and kiln bundle into the signed unified kernel
// images it makes, which must carry exactly the command line the node would
// write. The image partition's agent hands off to it (systemd/agent/handoff).
const AgentParam = "kiln.agent"

// AgentOption is the kernel parameter that runs the agent with digest d.
func AgentOption(d string) string { return AgentParam + "=" + d }
