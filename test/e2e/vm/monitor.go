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

// Monitor is a QMP connection to the running machine.
type Monitor struct {
	conn    net.Conn
	mu      sync.Mutex // one command at a time
	replies chan qmpMessage
	events  chan qmpMessage
	ports   map[string]string // disk id -> root port in use
	console io.Writer         // QEMU's stdin: the guest's serial port
	onReset func()            // told of each Reset (the reset watch)
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

// dialMonitor connects to QEMU's QMP socket (QEMU creates it right after it
// starts: retried for a few seconds) and leaves the greeting's capability
// negotiation done.
func dialMonitor(path string) (*Monitor, error) {
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if conn, err = net.Dial("unix", path); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connect to QMP socket %s: %w", path, err)
	}
	m := &Monitor{conn: conn, replies: make(chan qmpMessage), events: make(chan qmpMessage, 64), ports: map[string]string{}}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() { // the greeting
		conn.Close()
		return nil, fmt.Errorf("QMP %s: no greeting: %v", path, sc.Err())
	}
	go m.read(sc)
	if _, err := m.Execute("qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return m, nil
}

// read sorts what QEMU sends into replies and events until the socket
// closes (QEMU exited).
func (m *Monitor) read(sc *bufio.Scanner) {
	defer close(m.replies)
	for sc.Scan() {
		var msg qmpMessage
		if json.Unmarshal(sc.Bytes(), &msg) != nil {
			continue
		}
		if msg.Event != "" {
			select {
			case m.events <- msg:
			default: // nobody waits for this one
			}
			continue
		}
		m.replies <- msg
	}
}

// Type sends s to the guest's serial console as a technician's keyboard
// would ("\r" is Enter).
func (m *Monitor) Type(s string) error {
	if _, err := io.WriteString(m.console, s); err != nil {
		return fmt.Errorf("type on the serial console: %w", err)
	}
	return nil
}

// Execute runs one QMP command and returns its result.
func (m *Monitor) Execute(cmd string, args any) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := m.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	select {
	case msg, ok := <-m.replies:
		if !ok {
			return nil, fmt.Errorf("QMP %s: QEMU closed the monitor", cmd)
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
	port := ""
	used := map[string]bool{}
	for _, p := range m.ports {
		used[p] = true
	}
	for _, p := range hotplugPorts {
		if !used[p] {
			port = p
			break
		}
	}
	if port == "" {
		return fmt.Errorf("plug %s: all %d hot-plug ports are in use", id, len(hotplugPorts))
	}
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
	m.ports[id] = port
	return nil
}

// UnplugDisk pulls the disk id out: the guest is asked to release it, and
// UnplugDisk returns once QEMU reports the device gone (bounded).
func (m *Monitor) UnplugDisk(id string) error {
	dev := id + "-dev"
	for drained := false; !drained; { // events of earlier removals
		select {
		case <-m.events:
		default:
			drained = true
		}
	}
	if _, err := m.Execute("device_del", map[string]any{"id": dev}); err != nil {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	timeout := time.After(2 * time.Minute)
	for done := false; !done; {
		select {
		case ev := <-m.events:
			var d struct {
				Device string `json:"device"`
			}
			json.Unmarshal(ev.Data, &d)
			done = ev.Event == "DEVICE_DELETED" && d.Device == dev
		case <-timeout:
			return fmt.Errorf("unplug %s: the guest did not release the device within 2 minutes", id)
		}
	}
	delete(m.ports, id)
	if _, err := m.Execute("blockdev-del", map[string]any{"node-name": id}); err != nil {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	return nil
}

// Reset presses the machine's reset button: no shutdown, whatever the
// guest was writing is cut off (a power cut, short of losing the disk
// cache QEMU has already passed to the host).
func (m *Monitor) Reset() error {
	if m.onReset != nil {
		m.onReset()
	}
	return m.systemReset()
}

func (m *Monitor) systemReset() error {
	_, err := m.Execute("system_reset", nil)
	return err
}

func (m *Monitor) close() error {
	if m == nil {
		return nil
	}
	return errors.Join(m.conn.Close())
}
