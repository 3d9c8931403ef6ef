package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Output formats of get.
const (
	OutputTable = "table"
	OutputWide  = "wide"
	OutputYAML  = "yaml"
	OutputJSON  = "json"
)

// GetOptions are the arguments of `get`.
type GetOptions struct {
	Kind  string
	Names []string
	// Namespace for namespaced kinds; "" = "default". Ignored with
	// AllNamespaces and for cluster-wide kinds.
	Namespace     string
	AllNamespaces bool
	// Output is table (""), wide, yaml or json.
	Output string
}

// Get prints resources. Names that do not exist are reported in the
// returned error after the ones that do are printed.
func (c *Client) Get(ctx context.Context, out, errOut io.Writer, o GetOptions) error {
	info, err := ResolveKind(o.Kind)
	if err != nil {
		return err
	}
	switch o.Output {
	case "", OutputTable, OutputWide, OutputYAML, OutputJSON:
	default:
		return fmt.Errorf("unknown output format %q (want table, wide, yaml or json)", o.Output)
	}
	ns := namespaceFor(info, o.Namespace)
	if o.AllNamespaces {
		ns = ""
	}
	var objs []api.Object
	var errs []error
	if info.Kind == api.KindTier && o.Output != OutputYAML && o.Output != OutputJSON {
		objs, counts, err := c.tierObjects(ctx, o.Names)
		if err != nil {
			return err
		}
		return c.printTiers(out, objs, counts, o.Output == OutputWide)
	}
	if len(o.Names) == 0 {
		if objs, _, err = c.Store.List(ctx, info.Kind, ns); err != nil {
			return fmt.Errorf("listing %s: %w", info.Plural, err)
		}
	} else {
		if info.Namespaced && o.AllNamespaces {
			return errors.New("a resource cannot be retrieved by name across all namespaces")
		}
		for _, name := range o.Names {
			obj, err := c.Store.Get(ctx, info.Kind, ns, name)
			switch {
			case isNotFound(err):
				errs = append(errs, notFound(info, ns, name))
			case err != nil:
				errs = append(errs, err)
			default:
				objs = append(objs, obj)
			}
		}
	}
	if err := c.printObjects(ctx, out, errOut, info, objs, o, len(o.Names) == 1); err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (c *Client) printObjects(ctx context.Context, out, errOut io.Writer, info api.KindInfo, objs []api.Object, o GetOptions, single bool) error {
	switch o.Output {
	case OutputYAML, OutputJSON:
		if single {
			if len(objs) == 0 {
				return nil
			}
			b, err := api.Encode(objs[0], o.Output)
			if err != nil {
				return err
			}
			_, err = out.Write(b)
			return err
		}
		if len(objs) == 0 && o.Output == OutputYAML {
			return nil
		}
		b, err := api.EncodeList(objs, o.Output)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	if len(objs) == 0 {
		if len(o.Names) > 0 {
			return nil
		}
		msg := "No resources found."
		if info.Namespaced && !o.AllNamespaces {
			msg = fmt.Sprintf("No resources found in %s namespace.", namespaceFor(info, o.Namespace))
		}
		_, err := fmt.Fprintln(errOut, msg)
		return err
	}
	var pc printContext
	if info.Kind == api.KindNode {
		cfg, err := c.bgpConfig(ctx)
		if err != nil {
			return err
		}
		pc.bgp = cfg
	}
	if info.Kind == api.KindService {
		statuses, err := c.agentStatuses(ctx)
		if err != nil {
			return err
		}
		pc.services = indexServiceAds(statuses)
	}
	header, wide := columnsOf(info.Kind)
	if o.Output == OutputWide {
		header = append(header, wide...)
	}
	t := newTable(header...)
	for _, obj := range objs {
		cells, wideCells := rowOf(obj, pc)
		if o.Output == OutputWide {
			cells = append(cells, wideCells...)
		}
		t.add(cells...)
	}
	return t.writePlain(out)
}

// bgpConfig returns the cluster's BGPConfiguration, nil when there is none.
func (c *Client) bgpConfig(ctx context.Context) (*api.BGPConfiguration, error) {
	bc, err := datastore.GetAs[*api.BGPConfiguration](ctx, c.Store, api.KindBGPConfiguration, "", api.SingletonName)
	if isNotFound(err) {
		return nil, nil
	}
	return bc, err
}

// printTiers prints the effective tiers in evaluation order with how many
// policies (and, wide, staged policies) each holds.
func (c *Client) printTiers(out io.Writer, objs []api.Object, counts map[string][2]int, wide bool) error {
	header := []string{"NAME", "ORDER", "DEFAULT-ACTION", "POLICIES"}
	if wide {
		header = append(header, "STAGED")
	}
	t := newTable(header...)
	for _, obj := range objs {
		cells, w := tierRow(obj.(*api.Tier), counts)
		if wide {
			cells = append(cells, w...)
		}
		t.add(cells...)
	}
	return t.writePlain(out)
}
