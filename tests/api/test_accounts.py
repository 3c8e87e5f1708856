from apps.workspaces.models import Workspace
from tests.personas import World


def test_it_refuses_to_delete_the_group_of_a_team_workspace(world: World) -> None:
    response = world.client(world.admin).delete("/api/v1/groups/team-a/")
    assert response.status_code == 409, response.json()
    assert "team-a" in response.json()["error"]["message"]
    assert Workspace.objects.get(name="team-a").assigned_group.name == "team-a"
