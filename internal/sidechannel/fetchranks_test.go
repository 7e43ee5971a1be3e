package sidechannel

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/goleak"
)

// TestFetchRanksOneSocket serves a raw ROUTER that records who asked for
// what: every (pp, tp) request must come from one peer identity, in
// vLLM's itertools.product order, each reply matched to its rank.
func TestFetchRanksOneSocket(t *testing.T) {
	defer goleak.VerifyNone(t)
	router, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	_ = router.SetLinger(0)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := router.GetLastEndpoint()
	ranks := [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}}
	type seen struct {
		id     string
		pp, tp int
	}
	got := make(chan seen, len(ranks))
	served := make(chan error, 1)
	go func() {
		for range ranks {
			msg, err := router.RecvMessageBytes(0)
			if err != nil {
				served <- err
				return
			}
			pp, tp, err := DecodeGetMeta(msg[2])
			if err != nil {
				served <- err
				return
			}
			got <- seen{string(msg[0]), pp, tp}
			md := sampleMeta()
			md.Nixlctl = &Extra{Backend: "ucx", TPRank: tp, PPRank: pp, TPSize: 2, PPSize: 2}
			b, _ := EncodeAgentMetadata(md)
			payload, _ := EncodeHandshakePayload("h", b)
			if _, err := router.SendMessage(msg[0], "", payload, EncodeClock(1)); err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()
	hs, err := FetchRanks(context.Background(), ep, ranks, "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	close(got)
	var ids []string
	i := 0
	for s := range got {
		if s.pp != ranks[i][0] || s.tp != ranks[i][1] {
			t.Errorf("request %d asked for (%d, %d), want %v", i, s.pp, s.tp, ranks[i])
		}
		if x := hs[i].Meta.Nixlctl; x == nil || x.PPRank != s.pp || x.TPRank != s.tp {
			t.Errorf("reply %d is %+v, want rank (%d, %d)", i, x, s.pp, s.tp)
		}
		ids = append(ids, s.id)
		i++
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Errorf("requests came from %d peers, want one socket: %q", len(ids), ids)
			break
		}
	}
}

func TestFetchRanksStopsAtARefusal(t *testing.T) {
	ctx, s := serveMeta(t, "h", 0, 0)
	_, err := FetchRanks(ctx, s.Endpoint(), [][2]int{{0, 0}, {1, 0}, {0, 0}}, "h", 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "(pp 1, tp 0)") || !strings.Contains(err.Error(), "no reply within") {
		t.Errorf("unknown rank: %v", err)
	}
	if n, _ := s.Errors(); n != 1 {
		t.Errorf("server counted %d bad requests, want 1 (the fetch stops at the unanswered rank)", n)
	}
	if s.Served() != 1 || s.UnknownRanks() != 1 {
		t.Errorf("served %d, unknown %d; want 1 and 1", s.Served(), s.UnknownRanks())
	}
}

func TestBestClock(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, c := range []struct {
		rtts, offs []time.Duration
		want       time.Duration
	}{
		{nil, nil, 0},
		{[]time.Duration{3 * ms}, []time.Duration{7 * ms}, 7 * ms},
		{[]time.Duration{3 * ms, 1 * ms, 2 * ms}, []time.Duration{10 * ms, -4 * ms, 5 * ms}, -4 * ms},
		{[]time.Duration{1 * ms, 1 * ms}, []time.Duration{2 * ms, 9 * ms}, 2 * ms}, // ties keep the first
	} {
		t.Run(fmt.Sprint(c.rtts), func(t *testing.T) {
			var hs []Handshake
			for i := range c.rtts {
				hs = append(hs, Handshake{RTT: c.rtts[i], ClockOffset: c.offs[i]})
			}
			if got := BestClock(hs); got != c.want {
				t.Errorf("BestClock = %v, want %v", got, c.want)
			}
		})
	}
}
