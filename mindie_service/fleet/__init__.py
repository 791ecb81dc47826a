"""Where engines are composed: model instances behind one client (instances.py), prefix-aware routing between
them (prefix_routing.py), and what an inference gateway reads of the server (gateway_view.py). Reads engines
through their client and EngineStats; the engine never imports this package."""
