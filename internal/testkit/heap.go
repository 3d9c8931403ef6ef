package testkit

import (
	"os"
	"runtime"
	"runtime/pprof"
)

// HeapAfterGC is the heap's live bytes after a full collection: what a
// memory benchmark takes before and after building what it measures.
func HeapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// WriteHeapProfile writes the heap profile to the file name: what the
// memory benchmarks write when asked (TABBY_BENCH_HEAPPROFILE).
func WriteHeapProfile(name string) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
