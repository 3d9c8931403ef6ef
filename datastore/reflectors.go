package datastore

// BGPReflectorsKey holds the cluster's elected route reflectors
// (BGPConfiguration routeReflectorMode Auto): a bgp.ReflectorChoice as
// JSON, written by the agents with a compare-and-swap on its revision
// (docs/bgp.md, "Reflectors that place themselves").
const BGPReflectorsKey = "election/bgp-reflectors"
