package testkit

import "runtime"

// HeapAfterGC is the heap's live bytes after a full collection: what a
// memory benchmark takes before and after building what it measures.
func HeapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
