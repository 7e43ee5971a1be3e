package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// The endpoints of the handoff benchmarks take requests from the bench
// driver (which plays the router) over an asynchronous JSON-lines channel:
// requests carry an id and may be answered out of order, so one connection
// serves many requests in flight; the endpoint can also send events
// (blocks freed, leases expired) that nobody asked for.

// Message is one line of the channel.
type Message struct {
	ID     uint64          `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Event  string          `json:"event,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// MethodFunc answers one request.
type MethodFunc func(ctx context.Context, params json.RawMessage) (any, error)

// RPCServer dispatches requests to methods, each on its own goroutine.
type RPCServer struct {
	mu      sync.Mutex
	enc     *json.Encoder
	methods map[string]MethodFunc
	wg      sync.WaitGroup
}

// NewRPCServer writes replies and events to w.
func NewRPCServer(w io.Writer) *RPCServer {
	return &RPCServer{enc: json.NewEncoder(w), methods: map[string]MethodFunc{}}
}

// Handle registers a method.
func (s *RPCServer) Handle(name string, f MethodFunc) { s.methods[name] = f }

// Emit sends an event.
func (s *RPCServer) Emit(event string, data any) {
	b, err := json.Marshal(data)
	if err != nil {
		return
	}
	s.send(Message{Event: event, Data: b})
}

func (s *RPCServer) send(m Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.enc.Encode(m)
}

// Serve reads requests from r until EOF or ctx ends; it returns after
// every running request has been answered. A "close" request ends it.
func (s *RPCServer) Serve(ctx context.Context, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				return
			}
		}
	}()
	defer s.wg.Wait()
	for {
		var line []byte
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-lines:
			if !ok {
				return sc.Err()
			}
			line = l
		}
		var m Message
		if err := json.Unmarshal(line, &m); err != nil || m.Method == "" {
			s.send(Message{ID: m.ID, Error: fmt.Sprintf("malformed request: %v", err)})
			continue
		}
		if m.Method == "close" {
			s.wg.Wait()
			s.send(Message{ID: m.ID, Result: json.RawMessage("{}")})
			return nil
		}
		f, ok := s.methods[m.Method]
		if !ok {
			s.send(Message{ID: m.ID, Error: fmt.Sprintf("unknown method %q", m.Method)})
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			res, err := f(ctx, m.Params)
			rep := Message{ID: m.ID}
			if err != nil {
				rep.Error = err.Error()
			} else if rep.Result, err = json.Marshal(res); err != nil {
				rep.Error = err.Error()
			}
			s.send(rep)
		}()
	}
}

// Event is something an endpoint reported on its own.
type Event struct {
	Name string
	Data json.RawMessage
}

// RPCClient calls an RPCServer.
type RPCClient struct {
	mu      sync.Mutex
	w       io.WriteCloser
	next    uint64
	pending map[uint64]chan Message
	events  chan Event
	done    chan struct{}
	err     error
}

// NewRPCClient reads replies and events from r. Events are buffered; a
// consumer that never reads them only loses the oldest.
func NewRPCClient(r io.Reader, w io.WriteCloser) *RPCClient {
	c := &RPCClient{w: w, pending: map[uint64]chan Message{}, events: make(chan Event, 4096), done: make(chan struct{})}
	go c.read(r)
	return c
}

func (c *RPCClient) read(r io.Reader) {
	dec := json.NewDecoder(bufio.NewReader(r))
	var err error
	for {
		var m Message
		if err = dec.Decode(&m); err != nil {
			break
		}
		if m.Event != "" {
			select {
			case c.events <- Event{m.Event, m.Data}:
			default:
				<-c.events // drop the oldest rather than block replies
				c.events <- Event{m.Event, m.Data}
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("endpoint connection lost: %w", err)
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.done)
}

// Events delivers what the endpoint reported on its own.
func (c *RPCClient) Events() <-chan Event { return c.events }

// Done is closed when the connection is gone.
func (c *RPCClient) Done() <-chan struct{} { return c.done }

// Call sends a request and decodes the result into result (may be nil).
func (c *RPCClient) Call(ctx context.Context, method string, params, result any) error {
	p, err := json.Marshal(params)
	if err != nil {
		return err
	}
	ch := make(chan Message, 1)
	c.mu.Lock()
	if c.err != nil || c.w == nil {
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = errors.New("endpoint connection closed")
		}
		return err
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	b, _ := json.Marshal(Message{ID: id, Method: method, Params: p})
	_, err = c.w.Write(append(b, '\n'))
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	case m, ok := <-ch:
		if !ok {
			c.mu.Lock()
			defer c.mu.Unlock()
			return fmt.Errorf("%s: %w", method, c.err)
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if result != nil {
			return json.Unmarshal(m.Result, result)
		}
		return nil
	}
}

// Close asks the endpoint to finish and closes the write side.
func (c *RPCClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w == nil {
		return nil
	}
	b, _ := json.Marshal(Message{ID: 0, Method: "close"})
	_, _ = c.w.Write(append(b, '\n'))
	err := c.w.Close()
	c.w = nil
	return err
}
