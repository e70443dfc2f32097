"""The Ray side: client actors (``client_actor``), the server actor (``server_actor``) and RayFederation
(``federation``; resources, placement and faults in ``cluster``). Import the modules themselves: this package
imports nothing, so a client actor's process loads only what hosting clients needs."""
