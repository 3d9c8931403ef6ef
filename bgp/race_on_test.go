//go:build race

package bgp

const raceDetector = true
