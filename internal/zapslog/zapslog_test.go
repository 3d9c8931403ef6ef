package zapslog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestZapLoggerForwardsWarnings(t *testing.T) {
	var buf bytes.Buffer
	lg := New(slog.New(slog.NewTextHandler(&buf, nil))).Named("etcd").With(zap.String("member", "m1"))
	lg.Info("chatty")
	lg.Warn("slow disk", zap.Int("ms", 120))
	lg.Error("broken", zap.Error(errTest))
	out := buf.String()
	for _, want := range []string{"level=WARN msg=\"slow disk\"", "ms=120", "member=m1", "logger=etcd", "level=ERROR msg=broken", "error=boom"} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "chatty") {
		t.Errorf("info message forwarded:\n%s", out)
	}
	New(nil).Error("dropped") // must not panic
}

type testError string

func (e testError) Error() string { return string(e) }

const errTest = testError("boom")
