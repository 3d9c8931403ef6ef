// Package ctl is the logic behind tabbyctl, the operator CLI: resolving its
// configuration, reading and printing resources, applying manifests, IPAM
// reports, BGP session status and the explanation of a pod's path. Every
// command writes to the io.Writer it is given and returns its errors, so
// that cmd/tabbyctl stays a thin cobra layer and tests can run the commands
// in process.
package ctl
