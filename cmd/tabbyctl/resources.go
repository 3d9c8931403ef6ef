package main

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) getCmd() *cobra.Command {
	var o ctl.GetOptions
	cmd := &cobra.Command{
		Use:   "get KIND [NAME...]",
		Short: "Show resources",
		Long:  "Show resources as a table, a wide table, YAML or JSON.\n\n" + kindsHelp(),
		Example: `  tabbyctl get ippools
  tabbyctl get wep -A -o wide
  tabbyctl get node node-1 -o yaml`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: kindArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Kind, o.Names = args[0], args[1:]
			if _, err := ctl.ResolveKind(o.Kind); err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.Get(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	cmd.Flags().StringVarP(&o.Namespace, "namespace", "n", "", "namespace of namespaced kinds (default \"default\")")
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "list namespaced kinds in every namespace")
	cmd.Flags().StringVarP(&o.Output, "output", "o", ctl.OutputTable, "output format: table, wide, yaml or json")
	return cmd
}

// manifestFlags adds -f and -n.
func manifestFlags(cmd *cobra.Command, files *[]string, ns *string) {
	cmd.Flags().StringArrayVarP(files, "filename", "f", nil, "file, directory (its .yaml, .yml and .json files) or - for stdin; repeatable")
	cmd.Flags().StringVarP(ns, "namespace", "n", "", "namespace for namespaced resources that name none (default \"default\")")
}

func (a *app) manifests(cmd *cobra.Command, files []string, ns string) (ctl.ManifestOptions, error) {
	srcs, err := ctl.ReadSources(files, a.stdin)
	return ctl.ManifestOptions{Sources: srcs, Namespace: ns}, err
}

func (a *app) applyCmd() *cobra.Command {
	return a.manifestCmd("apply -f FILE|DIR|-", "Create or update resources from YAML or JSON",
		`Create or update every resource in the files (multi-document YAML, JSON, or
kind: List). Everything is validated first; if anything is invalid nothing changes.
IPPools are created through IPAM, which refuses a pool that overlaps another.`,
		(*ctl.Client).Apply)
}

func (a *app) createCmd() *cobra.Command {
	return a.manifestCmd("create -f FILE|DIR|-", "Create resources from YAML or JSON; existing ones are errors", "",
		(*ctl.Client).Create)
}

// manifestCmd is a command that reads resources from -f and hands them to run.
func (a *app) manifestCmd(use, short, long string, run func(*ctl.Client, context.Context, io.Writer, ctl.ManifestOptions) error) *cobra.Command {
	var files []string
	var ns string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := a.manifests(cmd, files, ns)
			if err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return run(c, cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	manifestFlags(cmd, &files, &ns)
	return cmd
}

func (a *app) deleteCmd() *cobra.Command {
	var files []string
	var ns string
	var ignore bool
	cmd := &cobra.Command{
		Use:   "delete (KIND NAME... | -f FILE|DIR|-)",
		Short: "Delete resources",
		Long: `Delete resources by kind and name, or those a file names.
An IPPool is deleted through IPAM: while any of its addresses is allocated the
deletion is refused; otherwise its blocks and affinities go with it.

` + kindsHelp(),
		ValidArgsFunction: kindArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(files) > 0 && len(args) > 0:
				return errors.New("give either KIND NAME... or -f, not both")
			case len(files) == 0 && len(args) == 0:
				return errors.New("give KIND NAME... or -f FILE")
			case len(args) > 0:
				if _, err := ctl.ResolveKind(args[0]); err != nil {
					return err
				}
			}
			var o ctl.ManifestOptions
			if len(files) > 0 {
				var err error
				if o, err = a.manifests(cmd, files, ns); err != nil {
					return err
				}
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if len(files) > 0 {
				o.IgnoreNotFound = ignore
				return c.DeleteManifests(cmd.Context(), cmd.OutOrStdout(), o)
			}
			return c.Delete(cmd.Context(), cmd.OutOrStdout(), args[0], ns, args[1:], ignore)
		},
	}
	manifestFlags(cmd, &files, &ns)
	cmd.Flags().BoolVar(&ignore, "ignore-not-found", false, "treat a missing resource as deleted")
	return cmd
}

func (a *app) labelCmd() *cobra.Command {
	var o ctl.LabelOptions
	cmd := &cobra.Command{
		Use:   "label KIND NAME KEY=VALUE... KEY-...",
		Short: "Set or remove labels of a resource",
		Example: `  tabbyctl label node node-1 rack=r1
  tabbyctl label node node-1 rack=r2 --overwrite
  tabbyctl label wep -n shop node--1-k8s-web--0-eth0 tier-`,
		Args:              cobra.MinimumNArgs(3),
		ValidArgsFunction: kindArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Kind, o.Name, o.Changes = args[0], args[1], args[2:]
			if _, err := ctl.ResolveKind(o.Kind); err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.Label(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVarP(&o.Namespace, "namespace", "n", "", "namespace of namespaced kinds (default \"default\")")
	cmd.Flags().BoolVar(&o.Overwrite, "overwrite", false, "allow changing a label's value")
	return cmd
}

func (a *app) validateCmd() *cobra.Command {
	var files []string
	var ns string
	cmd := &cobra.Command{
		Use:   "validate -f FILE|DIR|-",
		Short: "Check resources without applying them (no etcd needed)",
		Long:  "Decode, default and validate every resource; report every problem with its field path. Exits non-zero when anything is wrong.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := a.manifests(cmd, files, ns)
			if err != nil {
				return err
			}
			return ctl.Validate(cmd.OutOrStdout(), o)
		},
	}
	manifestFlags(cmd, &files, &ns)
	return cmd
}
