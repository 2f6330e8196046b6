package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
)

func TestHooksAndLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		replayed := func() (*http.Response, error) {
			resp, _ := status(201)()
			resp.Header.Set("Idempotent-Replayed", "true")
			return resp, nil
		}
		tr, _, jar := newTransport(t, status(503, "Retry-After", "2"), netErr(syscall.ECONNRESET), replayed)
		var logs bytes.Buffer
		tr.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var attempts, replays, giveUps, reconciles []idem.Event
		var retries []idem.Event
		tr.Hooks = idem.Hooks{
			OnAttempt:   func(e idem.Event) { attempts = append(attempts, e) },
			OnRetry:     func(e idem.Event) { retries = append(retries, e) },
			OnGiveUp:    func(e idem.Event) { giveUps = append(giveUps, e) },
			OnReplay:    func(e idem.Event) { replays = append(replays, e) },
			OnReconcile: func(e idem.Event) { reconciles = append(reconciles, e) },
		}
		ctx := idem.WithOperation(context.Background(), "op")
		if _, err := post(t, ctx, tr, `{}`); err != nil {
			t.Fatal(err)
		}
		if len(attempts) != 3 || attempts[2].Attempt != 3 || attempts[0].Op != "op" || attempts[0].Key == "" {
			t.Fatalf("OnAttempt events %+v; want 3 numbered attempts with op and key", attempts)
		}
		if len(retries) != 2 || retries[0].Status != 503 || retries[0].Wait != 2*time.Second || retries[0].Reason != "status 503" ||
			retries[1].Reason != "network error" || retries[1].Err == nil {
			t.Fatalf("OnRetry events %+v; want a 503 with a 2s wait, then a network error", retries)
		}
		if len(replays) != 1 || replays[0].Status != 201 || len(giveUps) != 0 || len(reconciles) != 0 {
			t.Fatalf("replays %+v give-ups %+v reconciles %+v; want one replay only", replays, giveUps, reconciles)
		}
		for _, want := range []string{`msg="idem: retrying"`, "status=503", "wait=2s", `msg="idem: attempt"`} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs.String())
			}
		}

		// Give-up and reconcile.
		tr2, _, _ := newTransport(t, netErr(syscall.ECONNREFUSED))
		tr2.Jar = jar
		tr2.Policy.MaxAttempts = 2
		tr2.Hooks = tr.Hooks
		if _, err := post(t, idem.WithOperation(context.Background(), "op2"), tr2, `{}`); err == nil {
			t.Fatal("want an error")
		}
		if len(giveUps) != 1 || giveUps[0].Op != "op2" || giveUps[0].Attempt != 2 {
			t.Fatalf("OnGiveUp events %+v; want one for op2 after 2 attempts", giveUps)
		}
		r, _ := jar.Get(ctx, "op2")
		backdate(t, jar, r, time.Now().Add(-25*time.Hour))
		if _, err := post(t, idem.WithOperation(context.Background(), "op2"), tr2, `{}`); err == nil {
			t.Fatal("want an error")
		}
		if len(reconciles) != 1 || reconciles[0].Op != "op2" {
			t.Fatalf("OnReconcile events %+v; want one for op2", reconciles)
		}
	})
}
