"""The Ray side: client actors (``client_actor``), the server actor (``server_actor``), RayFederation
(``federation``; resources, placement and faults in ``cluster``), the actors' own group (``collective``) and the
server replicated on the client actors (``replicas`` in the actors, ``replicated_server`` the driver's proxy).
Import the modules themselves: this package imports nothing, so a client actor's process loads only what hosting
clients needs."""
