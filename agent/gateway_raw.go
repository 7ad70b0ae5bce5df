// Raw TCP ports of the gateway: every port a session's `name:port` entry names.

package main

// syncRawPorts listens on every raw port the sessions name (step 3).
func (g *gateway) syncRawPorts(st *gwState) {}
