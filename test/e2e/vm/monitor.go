package vm

// QEMU's machine protocol (QMP) over a unix socket: what a test does to a
// running machine, the way a technician would with their hands: plug a disk
// in, pull it out, press reset.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"
)

// hotplugPorts are the PCIe root ports a test can plug disks into: q35's
// root bus takes no hot-plugged devices, a root port does (ACPI hot-plug,
// the guest kernel needs no USB). One per stick plugged at the same time.
var hotplugPorts = []string{"kiln-hp0", "kiln-hp1", "kiln-hp2", "kiln-hp3"}

func hotplugArgs() []string {
	var args []string
	for i, id := range hotplugPorts {
		args = append(args, "-device", fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d,slot=%d", id, i+1, i+1))
	}
	return args
}

// Monitor is the machine's QMP connection. A run may start QEMU more than
// once (a reset is a new QEMU process, see WithReboots): the Monitor stays,
// its connection is replaced at each start, and the disks plugged in at a
// reset are plugged in again before the firmware runs.
type Monitor struct {
	mu      sync.Mutex // one command at a time; guards q and console
	q       *qmpConn
	ports   map[string]string // disk id -> root port in use
	files   map[string]string // disk id -> image file
	console io.Writer         // QEMU's stdin: the guest's serial port
}

// qmpConn is one QEMU process's monitor socket.
type qmpConn struct {
	conn    net.Conn
	replies chan qmpMessage
	events  chan qmpMessage
	closed  chan struct{} // QEMU closed the socket (it exited)
	reason  string        // the SHUTDOWN event's reason, once QEMU sent it (read after closed)
}

type qmpMessage struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

func newMonitor() *Monitor {
	return &Monitor{ports: map[string]string{}, files: map[string]string{}}
}

// dialMonitor connects a new Monitor to QEMU's QMP socket.
func dialMonitor(path string) (*Monitor, error) {
	m := newMonitor()
	if err := m.attach(path); err != nil {
		return nil, err
	}
	return m, nil
}

// attach connects to a QEMU's QMP socket (QEMU creates it right after it
// starts: retried for a few seconds) and leaves the greeting's capability
// negotiation done.
func (m *Monitor) attach(path string) error {
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if conn, err = net.Dial("unix", path); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("connect to QMP socket %s: %w", path, err)
	}
	q := &qmpConn{conn: conn, replies: make(chan qmpMessage), events: make(chan qmpMessage, 64), closed: make(chan struct{})}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() { // the greeting
		conn.Close()
		return fmt.Errorf("QMP %s: no greeting: %v", path, sc.Err())
	}
	go q.read(sc)
	m.mu.Lock()
	if m.q != nil {
		m.q.conn.Close()
	}
	m.q = q
	m.mu.Unlock()
	if _, err := m.Execute("qmp_capabilities", nil); err != nil {
		conn.Close()
		return err
	}
	return nil
}

// read sorts what QEMU sends into replies and events until the socket
// closes (QEMU exited).
func (q *qmpConn) read(sc *bufio.Scanner) {
	defer close(q.closed)
	defer close(q.replies)
	for sc.Scan() {
		var msg qmpMessage
		if json.Unmarshal(sc.Bytes(), &msg) != nil {
			continue
		}
		if msg.Event != "" {
			if msg.Event == "SHUTDOWN" {
				var d struct {
					Reason string `json:"reason"`
				}
				json.Unmarshal(msg.Data, &d)
				q.reason = d.Reason // read by others only after closed
			}
			select {
			case q.events <- msg:
			default: // nobody waits for this one
			}
			continue
		}
		q.replies <- msg
	}
}

// current is the connection to the running QEMU.
func (m *Monitor) current() *qmpConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.q
}

// exitReason waits (bounded) until QEMU closed its monitor and returns
// the reason of its SHUTDOWN event: "guest-reset" (the guest rebooted),
// "host-qmp-system-reset" (Reset), "guest-shutdown" (power-off), or ""
// when QEMU ended without one (killed, crashed).
func (m *Monitor) exitReason() string {
	q := m.current()
	if q == nil {
		return ""
	}
	select {
	case <-q.closed:
		return q.reason
	case <-time.After(10 * time.Second):
		return ""
	}
}

// setConsole points Type at a new QEMU's serial port.
func (m *Monitor) setConsole(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.console = w
}

// replug plugs every disk that was in the machine at its reset into the
// new QEMU, at the same port, before the firmware runs (QEMU started with
// -S): a stick left in is still in after a reboot.
func (m *Monitor) replug() error {
	type disk struct{ id, file, port string }
	var disks []disk
	m.mu.Lock()
	for id, port := range m.ports {
		disks = append(disks, disk{id, m.files[id], port})
	}
	m.mu.Unlock()
	sort.Slice(disks, func(i, j int) bool { return disks[i].id < disks[j].id })
	for _, d := range disks {
		if err := m.plugAt(d.id, d.file, d.port); err != nil {
			return fmt.Errorf("plug in again after the reset: %w", err)
		}
	}
	return nil
}

// Type sends s to the guest's serial console as a technician's keyboard
// would ("\r" is Enter).
func (m *Monitor) Type(s string) error {
	m.mu.Lock()
	w := m.console
	m.mu.Unlock()
	if _, err := io.WriteString(w, s); err != nil {
		return fmt.Errorf("type on the serial console: %w", err)
	}
	return nil
}

// errMonitorClosed: QEMU exited (or reset: a new QEMU starts) before it
// answered.
var errMonitorClosed = errors.New("QEMU closed the monitor")

// Execute runs one QMP command and returns its result.
func (m *Monitor) Execute(cmd string, args any) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := m.q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	select {
	case msg, ok := <-m.q.replies:
		if !ok {
			return nil, fmt.Errorf("QMP %s: %w", cmd, errMonitorClosed)
		}
		if msg.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, msg.Error.Class, msg.Error.Desc)
		}
		return msg.Return, nil
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("QMP %s: no reply within a minute", cmd)
	}
}

// PlugDisk hot-plugs the raw image file as a virtio disk (the guest's next
// /dev/vdX), read-only as a write-protected stick, under id.
func (m *Monitor) PlugDisk(id, file string) error {
	m.mu.Lock()
	used := map[string]bool{}
	for _, p := range m.ports {
		used[p] = true
	}
	m.mu.Unlock()
	for _, p := range hotplugPorts {
		if !used[p] {
			return m.plugAt(id, file, p)
		}
	}
	return fmt.Errorf("plug %s: all %d hot-plug ports are in use", id, len(hotplugPorts))
}

func (m *Monitor) plugAt(id, file, port string) error {
	if _, err := m.Execute("blockdev-add", map[string]any{
		"driver": "raw", "node-name": id, "read-only": true,
		"file": map[string]any{"driver": "file", "filename": file, "read-only": true},
	}); err != nil {
		return fmt.Errorf("plug %s (%s): %w", id, file, err)
	}
	if _, err := m.Execute("device_add", map[string]any{
		"driver": "virtio-blk-pci", "drive": id, "id": id + "-dev", "bus": port,
	}); err != nil {
		m.Execute("blockdev-del", map[string]any{"node-name": id})
		return fmt.Errorf("plug %s (%s): %w", id, file, err)
	}
	m.mu.Lock()
	m.ports[id], m.files[id] = port, file
	m.mu.Unlock()
	return nil
}

// UnplugDisk pulls the disk id out: the guest is asked to release it, and
// UnplugDisk returns once QEMU reports the device gone (bounded), or once
// the machine went off (a stick pulled while the machine resets is out).
func (m *Monitor) UnplugDisk(id string) error {
	dev := id + "-dev"
	q := m.current()
	for drained := false; !drained; { // events of earlier removals
		select {
		case <-q.events:
		default:
			drained = true
		}
	}
	gone := func() {
		m.mu.Lock()
		delete(m.ports, id)
		delete(m.files, id)
		m.mu.Unlock()
	}
	if _, err := m.Execute("device_del", map[string]any{"id": dev}); err != nil {
		if errors.Is(err, errMonitorClosed) {
			gone()
			return nil
		}
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	timeout := time.After(2 * time.Minute)
	for done := false; !done; {
		select {
		case ev := <-q.events:
			var d struct {
				Device string `json:"device"`
			}
			json.Unmarshal(ev.Data, &d)
			done = ev.Event == "DEVICE_DELETED" && d.Device == dev
		case <-q.closed:
			gone()
			return nil
		case <-timeout:
			return fmt.Errorf("unplug %s: the guest did not release the device within 2 minutes", id)
		}
	}
	gone()
	if _, err := m.Execute("blockdev-del", map[string]any{"node-name": id}); err != nil && !errors.Is(err, errMonitorClosed) {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	return nil
}

// Reset presses the machine's reset button: no shutdown, whatever the
// guest was writing is cut off (a power cut, short of losing the disk
// cache QEMU has already passed to the host). QEMU exits on it and the run
// starts a new one (WithReboots).
func (m *Monitor) Reset() error {
	if _, err := m.Execute("system_reset", nil); err != nil && !errors.Is(err, errMonitorClosed) {
		return err
	}
	return nil
}

func (m *Monitor) close() error {
	if q := m.current(); q != nil {
		return q.conn.Close()
	}
	return nil
}
