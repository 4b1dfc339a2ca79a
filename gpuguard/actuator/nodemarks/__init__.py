"""Paper C's node list on this node: whether new real-time containers may be placed here
(``nodelist``, pure), kept in the journal and carried out as the Swarm node label
(``marks``) or a Kubernetes taint and label (``taints``)."""
