package units

import (
	"fmt"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// ReflashParams are the inputs of a reflash stick's units.
type ReflashParams struct {
	PartitionGUID string // the payload partition's unique GUID
	Unattended    bool   // do not ask on the console (the record may say so too)
}

// reflashMountUnit is systemd's name for recovery.MountPoint's mount unit
// (systemd-escape --path --suffix=mount /run/kiln/reflash).
const reflashMountUnit = "run-kiln-reflash.mount"

// RenderReflash returns the stick's units: the payload mount and the
// service that runs kiln agent reflash from it, both enabled.
func RenderReflash(p ReflashParams) ([]ignition.Unit, error) {
	if !guidRE.MatchString(p.PartitionGUID) {
		return nil, fmt.Errorf("render reflash units: payload partition GUID %q is not a GUID", p.PartitionGUID)
	}
	v := struct {
		PartitionGUID, MountPoint, MountUnit, Agent string
		Unattended                                  bool
	}{p.PartitionGUID, recovery.MountPoint, reflashMountUnit, recovery.MountPoint + "/" + recovery.AgentBinary, p.Unattended}
	var units []ignition.Unit
	for _, name := range []string{recovery.Unit, reflashMountUnit} {
		text, err := renderUnit(name, v)
		if err != nil {
			return nil, err
		}
		units = append(units, ignition.Unit{Name: name, Contents: text, Enabled: true})
	}
	return units, nil
}
