// Package cni owns the Tabby CNI plugin shim and the wire protocol between
// the shim and tabby-agent.
//
// The shim (PluginMain, run by the tiny cmd/tabby binary that the container
// runtime execs) parses the CNI request, forwards it as one JSON Request over
// the agent's unix socket and prints the agent's answer: the CNI result,
// already converted to the cniVersion of the network configuration, or a CNI
// error object. It keeps no state and never touches the kernel.
//
// The agent side (Server) listens on that socket, parses the network
// configuration and CNI_ARGS with the same code as the shim, serialises
// requests per container ID, calls a Handler and maps its errors to CNI
// error codes.
//
// This package imports only the CNI library and the standard library, so
// that the plugin binary stays small and starts fast.
package cni
