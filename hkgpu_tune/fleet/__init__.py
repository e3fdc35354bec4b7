"""Many nodes: rack runs through ansible-runner and the node side of the Ansible module."""
