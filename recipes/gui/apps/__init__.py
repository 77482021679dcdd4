"""The GUI recipe's web apps (a shop, a booking form, a docs site), standard library only, served by one process.

``core`` routes requests to pure handlers over one JSON state (so tests replay them without sockets), ``server``
serves them over HTTP on loopback and persists the state after every change.
"""
