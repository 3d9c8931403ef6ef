package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/tabbynet/tabby/policy"
)

// FirewallAuto picks nftables where the kernel has it, else iptables.
const FirewallAuto = "auto"

// NewFirewall returns the configured backend (FirewallConfig.Firewall) and
// removes Tabby's state of the other backend from the namespace, so that
// switching backends leaves no stale rules. Auto picks nftables when a
// netlink nf_tables connection works in the namespace, else iptables.
// Removing the other backend's state is best effort: it starts iptables
// processes once, at start-up, never during Apply.
func NewFirewall(cfg FirewallConfig) (Firewall, error) {
	switch cfg.Firewall {
	case "", FirewallAuto, FirewallNFTables:
		f, err := NewNFTFirewall(NFTConfig{NetNS: cfg.NetNS, Resync: cfg.Resync, FlowLog: cfg.FlowLog, Log: cfg.Log})
		if err == nil {
			_ = removeIPTablesState(cfg.NetNS) // nothing to do on most nodes; retried at the next start
			return f, nil
		}
		if cfg.Firewall == FirewallNFTables {
			return nil, err
		}
		fallthrough
	case FirewallIPTables:
		f, err := NewIPTablesFirewall(cfg)
		if err != nil {
			return nil, err
		}
		if err := removeNFTState(cfg.NetNS); err != nil && cfg.Firewall == FirewallIPTables {
			return nil, fmt.Errorf("removing the nftables backend's state: %w", err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("firewall backend %q: want auto, nftables or iptables", cfg.Firewall)
}

// RemoveFirewalls removes every piece of Tabby firewall state from the
// network namespace at nodeNetNSPath ("" = the caller's): the nftables
// table NFTTable, and for each installed iptables mode (legacy, nft) the
// tabby- chains, the jumps to them and the tabby- ipsets. Foreign rules
// and sets are untouched; missing state is success. It is what
// `tabby-agent cleanup` calls; it starts iptables/ipset processes.
func RemoveFirewalls(nodeNetNSPath string) error {
	return errors.Join(removeNFTState(nodeNetNSPath), removeIPTablesState(nodeNetNSPath))
}

func removeNFTState(netnsPath string) error {
	f, err := NewNFTFirewall(NFTConfig{NetNS: netnsPath})
	if err != nil {
		return nil // no nf_tables, so no nftables state
	}
	return errors.Join(f.Remove(context.Background()), f.Close())
}

// removeIPTablesState removes Tabby's iptables state of each installed
// mode. Both modes share the ipsets, and a set still referenced by the
// other mode's rules cannot be destroyed until those are gone: a second
// round finishes what the first could not.
func removeIPTablesState(netnsPath string) error {
	var errs []error
	for range 2 {
		errs = nil
		for _, mode := range []string{BackendLegacy, BackendNFT} {
			if _, _, _, err := backendBinaries(mode, policy.IPv4); err != nil {
				continue
			}
			if _, err := exec.LookPath("ipset"); err != nil {
				continue
			}
			f, err := NewIPTablesFirewall(FirewallConfig{NetNS: netnsPath, Backend: mode, Resync: -1})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := f.Remove(context.Background()); err != nil {
				errs = append(errs, fmt.Errorf("iptables (%s): %w", mode, err))
			}
		}
		if len(errs) == 0 {
			return nil
		}
	}
	return errors.Join(errs...)
}
