"""The Ray side: client actors, the server actor and RayFederation (resources, placement, faults)."""

from fedcomp.actors.cluster import ActorPlan, connect, plan_actors
from fedcomp.actors.federation import RayFederation
from fedcomp.actors.server_actor import RayServer

__all__ = ["ActorPlan", "RayFederation", "RayServer", "connect", "plan_actors"]
